"""One experiment condition → one scenario → one tidy result row per seeded run.

A `Condition` holds only primitives, so it pickles to worker processes. `run_condition`
builds the scenario, runs the chosen stack on the simulator, and measures it from the trace
exactly as `floorguard simulate` does. Per-process memos (`functools.cache`) keep the
measured `μ_sat` and loaded traces from being recomputed per run.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from floorguard.analysis.metrics import RunMetrics, entitled_ids, measure
from floorguard.analysis.records import TraceRecords, fold_trace
from floorguard.baselines.flow_control import FlowControlOptions, MappingFault, Objective
from floorguard.baselines.registry import RateLimits, StackOptions
from floorguard.core.contract import (
    CapacityAction,
    Contract,
    ContractClass,
    ExcessPolicy,
    MeterKind,
    SurplusOrder,
    WindowSchedule,
)
from floorguard.core.events import EventKind, TraceEvent
from floorguard.core.learner import Learner, LoadSnapshot, Proposal
from floorguard.core.monitors import assumptions_of, first_token_of
from floorguard.core.request import Request
from floorguard.learners.registry import LearnerOptions, needs_latency_model
from floorguard.profiles import get_profile
from floorguard.sim.probe import latency_model_for, probe_lengths
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import (
    ASSURED_TENANT,
    OPPORTUNISTIC_TENANT,
    POLITE_TENANT,
    Scenario,
    kv_pressure,
    marquee,
)
from floorguard.sim.targets import saturated_capacity
from floorguard.sim.traces import TraceData, load_trace
from floorguard.sim.workloads import (
    BimodalLength,
    ByFraction,
    FixedLength,
    GammaArrivals,
    PacedArrivals,
    PoissonArrivals,
    Stream,
    SyntheticStream,
    TraceLength,
    TraceStream,
)

__all__ = [
    "Condition",
    "build_scenario",
    "first_token_row",
    "learner_options_of",
    "load_of",
    "measured_row",
    "mu_sat_of",
    "run_condition",
    "trace_of",
]


@dataclass(frozen=True)
class Condition:
    """Every knob an experiment turns. Defaults are docs/design.md §10's marquee."""

    policy: str = "guard"
    learner: str = "always-admit"
    beta: float = 1.0
    profile: str = "v100-moe"
    floor: int = 6
    slots: int = 4
    deadline_ms: float = 1820.0
    window_s: float = 1.0
    workload: str = "marquee"
    """marquee | paced-bimodal | burst | gamma | trace | polite | kv-pressure | chat-flood"""
    duration_s: float = 12.0
    assured_rate: float = 6.0
    opp_rate: float = 16.0
    tokens: int = 16
    long_tokens: int = 256
    long_fraction: float = 0.0
    excess: str = "reject"
    meter: str = "count"
    doom_gate: bool = False
    """Off, as in the published comparisons (docs/design.md §4.3, §11): the floor must be shown to
    rest on AF + SF without DR. On only where an experiment tests the gate (E15)."""
    gate_lower_ms: float = 0.0
    """With the gate on: > 0 is the published constant `L` (ms); 0 is the profile's exact
    per-length minimum `L(ℓ)` (our extension)."""
    capacity_action: str = "alarm"
    mapping_fault: str = "none"
    low_band_priority: int = -1
    """Flow control's opportunistic band: −1 is sheddable (rejected while saturated), ≥ 0
    queues."""
    queue_ttl_s: float = 0.0
    """Flow control's queue TTL; 0: each request's own deadline budget."""
    assured_poisson: bool = False
    """The marquee's assured stream as Poisson (the variant) instead of paced."""
    predictor: str = "published"
    """The latency predictor's fit (`sim.probe`): `published` (probes idle to saturated)
    or `light-only` (light-load probes alone: it never sheds)."""
    replay_admission: bool = False
    """Admit exactly what the guard (assured-first) run of the same seed admitted: the
    learner is replaced by that run's decisions (E3's byte-identical admission)."""
    cv: float = 2.9
    trace_path: str = ""
    slice_index: int = 0
    slice_s: float = 120.0
    """Slice k replays trace offsets [k·slice_s, (k + 1)·slice_s)."""
    speedup: float = 1.0
    assured_fraction: float = 0.3
    max_tokens: int = 48
    burst_size: int = 40
    burst_assured: int = 5
    """Assured requests inside the burst (paced over its 0.5 s from 50 ms)."""
    surplus: str = "fair"
    """The guard's surplus order (docs/design.md §15): `fair` across tenants, or `learner` (the
    published guard's single order)."""
    polite_rate: float = 2.0
    """`polite`: a second opportunistic tenant's Poisson rate beside the flood (E20)."""
    polite_prompt_tokens: int = 0
    """`polite`: the polite tenant's prompt (its output is `tokens`)."""
    flood_tokens: int = 0
    """`polite`, `chat-flood`: the flooder's output cap; 0: `tokens`, as the others'."""
    ttft_ms: float = 0.0
    """The assured contract's TTFT (docs/design.md §19); 0: none."""
    tpot_ms: float = 0.0
    """The assured contract's TPOT; with `ttft_ms`, instead of `deadline_ms` (its requests
    are due at ttft + tpot·ℓ); 0: none."""
    reserved_slots: int = 0
    """`r`: the guard's slots kept for the floor's first tokens (docs/design.md §19)."""
    kv_blocks: int = 32
    """`kv-pressure` (E21): the simulated backend's KV cache, in `kv_block_tokens` blocks."""
    kv_block_tokens: int = 16
    """`kv-pressure`: the cache's block size (vLLM's CPU build: 128; a real backend's own)."""
    kv_budget: bool = False
    """`kv-pressure`: the guard budgets that cache (design §16), or dispatches by slots only."""
    forward_priority: bool = False
    """`kv-pressure`: the guard forwards each class's priority to a vLLM that schedules by
    priority, so its cache preempts the surplus first (server priority always does)."""
    static_caps_at_capacity: bool = False
    """The rate-limit stacks' buckets from the measured `μ_sat` (docs/design.md §11, E9): the
    assured one at B/W, the opportunistic one at what is left of `μ_sat`, the flat one at
    `μ_sat`; false: `RateLimits`' defaults."""
    detail: bool = False
    """Keep per-request assured timings of this run (for a figure)."""
    keep_samples: bool = False
    """Keep the assured sojourns and all service times (the screen's evaluation)."""
    keep_ids: bool = False
    """Keep the ids of the requests the doom gate dropped and of those completed on time
    (E15's counterfactual replay against the same seed with the gate off)."""


@functools.cache
def mu_sat_of(profile: str, slots: int) -> float:
    return saturated_capacity(get_profile(profile), 16, slots)[0]


@functools.cache
def trace_of(path: str) -> TraceData:
    """A trace file, loaded once per process."""
    return load_trace(path)


def _contracts(c: Condition) -> tuple[Contract, ...]:
    deadline_s = c.deadline_ms / 1e3
    floor = c.floor
    if c.meter == MeterKind.TOKEN.value:
        floor = c.floor * c.tokens  # B requests' worth of short-request tokens
    polite = (
        (Contract(POLITE_TENANT, ContractClass.OPPORTUNISTIC, deadline_s),)
        if c.workload == "polite"
        else ()
    )
    ttft_s = c.ttft_ms / 1e3 if c.ttft_ms > 0 else None
    tpot_s = c.tpot_ms / 1e3 if c.tpot_ms > 0 else None
    assured = Contract(
        ASSURED_TENANT,
        ContractClass.ASSURED,
        None if ttft_s is not None and tpot_s is not None else deadline_s,
        floor,
        ExcessPolicy(c.excess),
        ttft_s,
        tpot_s,
    )
    return (
        assured,
        Contract(OPPORTUNISTIC_TENANT, ContractClass.OPPORTUNISTIC, deadline_s),
        *polite,
    )


def _streams(c: Condition) -> tuple[Stream, ...]:
    short = FixedLength(c.tokens)
    flood_length = FixedLength(c.flood_tokens or c.tokens)
    flood = (
        (
            SyntheticStream(
                OPPORTUNISTIC_TENANT, PoissonArrivals(c.opp_rate), flood_length, c.duration_s
            ),
        )
        if c.opp_rate > 0
        else ()
    )
    if c.workload == "polite":  # E20: a flooder and a polite tenant beside the floor
        return (
            SyntheticStream(ASSURED_TENANT, PacedArrivals(c.assured_rate), short, c.duration_s),
            SyntheticStream(
                OPPORTUNISTIC_TENANT, PoissonArrivals(c.opp_rate), flood_length, c.duration_s
            ),
            SyntheticStream(
                POLITE_TENANT,
                PoissonArrivals(c.polite_rate),
                short,
                c.duration_s,
                prompt_tokens=c.polite_prompt_tokens,
            ),
        )
    if c.workload in ("paced-bimodal", "chat-flood"):  # chat-flood: E23's long decodes
        lengths = (
            BimodalLength(c.tokens, c.long_tokens, c.long_fraction)
            if c.workload == "paced-bimodal"
            else short
        )
        return (
            SyntheticStream(ASSURED_TENANT, PacedArrivals(c.assured_rate), lengths, c.duration_s),
            *flood,
        )
    if c.workload == "burst":
        burst = SyntheticStream(OPPORTUNISTIC_TENANT, PacedArrivals(c.burst_size / 0.5), short, 0.5)
        assured = SyntheticStream(
            ASSURED_TENANT, PacedArrivals(c.burst_assured / 0.5), short, 0.5, start_s=0.05
        )
        return (burst, assured)
    if c.workload == "gamma":
        lengths = BimodalLength(c.tokens, c.max_tokens, 0.5)
        return (
            SyntheticStream(
                ASSURED_TENANT, GammaArrivals(c.assured_rate, c.cv), lengths, c.duration_s
            ),
            SyntheticStream(
                OPPORTUNISTIC_TENANT, GammaArrivals(c.opp_rate, c.cv), lengths, c.duration_s
            ),
        )
    if c.workload == "trace":
        return (
            TraceStream(
                trace_of(c.trace_path),
                ByFraction(ASSURED_TENANT, OPPORTUNISTIC_TENANT, c.assured_fraction),
                TraceLength(cap=c.max_tokens),
                offset_s=c.slice_index * c.slice_s,
                duration_s=c.slice_s,
                speedup=c.speedup,
            ),
        )
    return marquee(
        duration_s=c.duration_s,
        assured_rate_per_s=c.assured_rate,
        opportunistic_rate_per_s=c.opp_rate,
        num_output_tokens=c.tokens,
        assured_poisson=c.assured_poisson,
    ).streams


def _false_drops(events: list[TraceEvent], scenario: Scenario) -> int:
    """Drops with t + L_model(ℓ) ≤ D, `L_model` the profile's exact minimum service: drops
    of requests that could still have been on time on this model (an upper bound on the
    drops whose request would have been). 0 by construction for the per-length gate; the
    published constant `L` is no minimum, so it can drop such requests."""
    lower = scenario.profile.lower
    return sum(
        1
        for e in events
        if e.kind is EventKind.DROP
        and e.reason == "doomed"
        and e.deadline_at is not None
        and e.at + lower.at(e.num_output_tokens or 0) <= e.deadline_at
    )


class _Replay:
    """A learner that admits exactly the request ids it was given (E3: the assured-first
    run's admissions, replayed under FIFO)."""

    name = "replay"

    def __init__(self, admitted: frozenset[object]) -> None:
        self.admitted = admitted

    def propose(
        self, request: Request, cls: ContractClass, load: LoadSnapshot, now: float
    ) -> Proposal:
        return Proposal(admit=request.request_id in self.admitted)


def _wait_growth_ms_per_s(trace: TraceRecords) -> float | None:
    """Slope of assured queue wait (dispatch − arrival) over arrival time, ms per s: ≈ 0 for
    a stable queue, the growth rate past the break."""
    started = [r for r in trace.of_class(ContractClass.ASSURED) if not math.isnan(r.dispatched_at)]
    if len(started) < 3:
        return None
    at = np.array([r.arrival_at for r in started])
    wait = np.array([r.dispatched_at - r.arrival_at for r in started])
    return float(np.polyfit(at, wait, 1)[0] * 1e3) if np.ptp(at) > 0 else None


def _short_and_entitled(c: Condition, trace: TraceRecords) -> dict[str, int]:
    """E10's counts: assured requests of the short length (admitted, late), and the
    count-entitled ones (the first B assured arrivals of each window, whatever the meter)
    that were refused."""
    assured = trace.of_class(ContractClass.ASSURED)
    short = [r for r in assured if r.num_output_tokens <= c.tokens]
    used: dict[int, int] = {}
    shed = 0
    for r in assured:
        window = math.floor(r.arrival_at / c.window_s)
        if used.get(window, 0) < c.floor:
            used[window] = used.get(window, 0) + 1
            shed += not r.admitted
    return {
        "a_short_admitted": sum(r.admitted for r in short),
        "a_short_late": sum(r.outcome == "completed" and r.late for r in short),
        "count_entitled_shed": shed,
    }


def first_token_row(c: Condition, trace: TraceRecords, origin_at: float = 0.0) -> dict[str, Any]:
    """E23's measures: the floor-entitled requests (the contract's first `B` of each window,
    whatever the stack) whose first token came by arrival + TTFT; the assured TTFT's p99
    and largest; and the surplus's output tokens produced while the flood was offered
    (until `origin_at` + the run length), per second — each request's tokens spread evenly
    from its first token to its end, which a client sees as the simulator does."""
    ttft_s = c.ttft_ms / 1e3
    entitled = entitled_ids(trace)
    assured = trace.of_class(ContractClass.ASSURED)
    ttfts = sorted(
        r.first_token_at - r.arrival_at for r in assured if not math.isnan(r.first_token_at)
    )
    floor = [r for r in assured if r.request_id in entitled]
    met = sum(1 for r in floor if r.first_token_at - r.arrival_at <= ttft_s)
    tpots = sorted(
        (r.ended_at - r.first_token_at) / (r.num_output_tokens - 1)
        for r in assured
        if r.outcome == "completed" and r.num_output_tokens > 1 and r.first_token_at < r.ended_at
    )
    end = origin_at + c.duration_s
    produced = 0.0
    for r in trace.of_class(ContractClass.OPPORTUNISTIC):
        first, last = r.first_token_at, r.ended_at
        if r.outcome == "completed" and first < end and last > first:
            produced += r.num_output_tokens * (min(last, end) - first) / (last - first)
    return {
        "ttft_entitled": len(floor),
        "ttft_met": met,
        "a_ttft_p99_s": float(np.percentile(ttfts, 99)) if ttfts else None,
        "a_ttft_max_s": ttfts[-1] if ttfts else None,
        "a_tpot_p99_s": float(np.percentile(tpots, 99)) if tpots else None,
        "o_tokens_per_s": produced / c.duration_s,
    }


def _entitled_admitted(trace: TraceRecords) -> int:
    """Floor-entitled requests (contract windows at φ = 0) that were admitted at all."""
    ids = entitled_ids(trace)
    return sum(1 for r in trace.records if r.request_id in ids and r.admitted)


def build_scenario(c: Condition) -> Scenario:
    if c.workload == "kv-pressure":  # E21: its own prompts, lengths and deadline
        return kv_pressure(
            kv_blocks=c.kv_blocks,
            budget=c.kv_budget,
            duration_s=c.duration_s,
            priorities=c.policy == "server-priority" or c.forward_priority,
            floor=c.floor,
            block_tokens=c.kv_block_tokens,
            window_s=c.window_s,
            opp_rate_per_s=c.opp_rate,
            deadline_s=c.deadline_ms / 1e3,
            profile=c.profile,
        )
    return Scenario(
        name=c.workload,
        contracts=_contracts(c),
        streams=_streams(c),
        profile=get_profile(c.profile),
        slots=(c.slots,),
        schedule=WindowSchedule(c.window_s),
        meter=MeterKind(c.meter),
        doom_gate=c.doom_gate,
        gate_lower_s=c.gate_lower_ms / 1e3 if c.gate_lower_ms > 0 else None,
        capacity_action=CapacityAction(c.capacity_action),
        surplus=SurplusOrder(c.surplus),
        reserved_slots=c.reserved_slots,
    )


def measured_row(c: Condition, seed: int, m: RunMetrics) -> dict[str, Any]:
    """The head of a run's row, whoever measured it (the simulator's trace, or a client on
    a real backend): the condition, the seed, each class's counts and ratios, the floor."""
    return {
        **asdict(c),
        "seed": seed,
        **{f"a_{k}": v for k, v in m.assured.as_dict().items()},
        **{f"o_{k}": v for k, v in m.opportunistic.as_dict().items()},
        "entitled": m.num_entitled,
        "entitled_met": m.phase_counts[0][1],
    }


def load_of(m: RunMetrics, mu_sat: float) -> tuple[float, float]:
    """(ρ_emp, ρ̂): admitted and offered load over the run's span, against `μ_sat`."""
    span = m.span_s if m.span_s > 0 else math.nan
    admitted = m.assured.admitted + m.opportunistic.admitted
    offered = m.assured.offered + m.opportunistic.offered
    return admitted / span / mu_sat, offered / span / mu_sat


def learner_options_of(c: Condition) -> LearnerOptions:
    """β and the SLO of `c`'s learner; a predictor's model fitted once per profile and C."""
    model = (
        latency_model_for(
            c.profile, c.slots, c.predictor, probe_lengths(c.tokens, c.long_tokens, c.long_fraction)
        )
        if needs_latency_model(c.learner)
        else None
    )
    return LearnerOptions(beta=c.beta, slo_s=c.deadline_ms / 1e3, latency_model=model)


def _admitted_ids(c: Condition, seed: int) -> frozenset[object]:
    run = simulate_once(
        build_scenario(c),
        seed=seed,
        policy=c.policy,
        learner=c.learner,
        learner_options=learner_options_of(c),
    )
    assert run.events is not None
    return frozenset(r.request_id for r in fold_trace(run.events).records if r.admitted)


def _rate_limits(c: Condition) -> RateLimits:
    if not c.static_caps_at_capacity:
        return RateLimits()
    mu_sat = mu_sat_of(c.profile, c.slots)
    return RateLimits(
        opportunistic_per_s=max(mu_sat - c.floor / c.window_s, 0.0), flat_per_s=mu_sat
    )


def run_condition(c: Condition, seed: int) -> dict[str, Any]:
    """Run one seeded replication of `c`; return its tidy row (plus nested extras)."""
    scenario = build_scenario(c)
    learner: str | Callable[[np.random.Generator], Learner] = c.learner
    if c.replay_admission:
        admitted = _admitted_ids(replace(c, policy="guard", replay_admission=False), seed)
        learner = lambda rng: _Replay(admitted)  # noqa: E731
    run = simulate_once(
        scenario,
        seed=seed,
        policy=c.policy,
        learner=learner,
        learner_options=learner_options_of(c),
        stack_options=_stack_options(c),
    )
    assert run.events is not None
    trace = fold_trace(run.events)
    m = measure(trace)
    mu_sat = mu_sat_of(c.profile, c.slots)
    rho_emp, rho_hat = load_of(m, mu_sat)
    stack = run.guard
    region = assumptions_of(scenario.guard_config(), [stack])
    first = first_token_of(scenario.guard_config(), [stack]) if c.ttft_ms > 0 else None
    row: dict[str, Any] = {
        **measured_row(c, seed, m),
        "entitled_admitted": _entitled_admitted(trace),
        "attainment": m.attainment,
        "attainment_worst_phase": m.attainment_worst_phase,
        "worst_phase_s": m.worst_phase_s,
        "rho_eff": m.rho_eff,
        "mu_sat": mu_sat,
        "rho_emp": rho_emp,
        "rho_hat": rho_hat,
        "max_assured_backlog": m.max_assured_backlog,
        "goodput_per_s": m.goodput_per_s,
        "span_s": m.span_s,
        "fire_cv": m.fire_cv,
        "max_fire_lag_s": m.max_fire_lag_s,
        "dr_firings": sum(
            1 for e in run.events if e.kind is EventKind.DROP and e.reason == "doomed"
        ),
        "dr_firings_assured": sum(
            1
            for e in run.events
            if e.kind is EventKind.DROP and e.reason == "doomed" and e.cls is ContractClass.ASSURED
        ),
        "false_drops": _false_drops(run.events, scenario),
        "a_wait_growth_ms_per_s": _wait_growth_ms_per_s(trace),
        **_short_and_entitled(c, trace),
        "capacity_alarms": stack.capacity.num_alarms if hasattr(stack, "capacity") else None,
        "max_service_s": stack.envelope.max_service_s,
        "num_above_ceiling": stack.envelope.num_above_upper,
        "rho_a": region.rho_a,
        "bound_s": region.bound_s,
        "inside_region": region.inside,
        "ft_bound_s": first.bound_s if first is not None else None,
        "ft_inside": first.inside if first is not None else None,
        "held": m.assured.late == 0,
        "phase_counts": list(m.phase_counts),
        "preemptions": run.preemptions,
        "a_preempted": run.preempted.get(ASSURED_TENANT, 0),
    }
    if c.replay_admission:
        row["admission_identical"] = admitted == frozenset(
            r.request_id for r in trace.records if r.admitted
        )
    row.update(_kept(c, trace, m))
    return row


def _stack_options(c: Condition) -> StackOptions:
    """The comparison stacks' options a condition sets: rate limits and flow control."""
    return StackOptions(
        rate_limits=_rate_limits(c),
        flow_control=FlowControlOptions(
            objectives={
                ContractClass.ASSURED: Objective("premium", 10),
                ContractClass.OPPORTUNISTIC: Objective(
                    "sheddable" if c.low_band_priority < 0 else "standard",
                    c.low_band_priority,
                ),
            },
            mapping_fault=MappingFault(c.mapping_fault),
            queue_ttl_s=c.queue_ttl_s if c.queue_ttl_s > 0 else None,
        ),
    )


def _doom_causes(trace: TraceRecords) -> dict[str, int]:
    """Each doomed drop by what kept it waiting (E15 accounts for every firing): an
    opportunistic one `overtaken` by at least one assured request that arrived after it
    and started while it waited (assured-first dispatch), or `queued` behind what was
    admitted before it; an assured one `assured`."""
    assured = sorted(
        (r.arrival_at, r.dispatched_at)
        for r in trace.of_class(ContractClass.ASSURED)
        if not math.isnan(r.dispatched_at)
    )
    causes = {"assured": 0, "overtaken": 0, "queued": 0}
    for r in trace.records:
        if r.outcome != "dropped" or r.reason != "doomed":
            continue
        if r.cls is ContractClass.ASSURED:
            causes["assured"] += 1
            continue
        later = assured[bisect.bisect_right(assured, (r.arrival_at, math.inf)) :]
        overtaken = any(dispatched < r.ended_at for _, dispatched in later)
        causes["overtaken" if overtaken else "queued"] += 1
    return causes


def _kept(c: Condition, trace: TraceRecords, m: RunMetrics) -> dict[str, Any]:
    """The per-request extras a condition asks its row to keep (samples, ids, detail)."""
    row: dict[str, Any] = {}
    if c.workload == "polite":  # E20: each opportunistic tenant's own share of the surplus
        for name, tenant in (("polite", POLITE_TENANT), ("flood", OPPORTUNISTIC_TENANT)):
            mine = [r for r in trace.records if r.tenant == tenant]
            row[f"{name}_offered"] = len(mine)
            row[f"{name}_admitted"] = sum(r.admitted for r in mine)
            row[f"{name}_on_time"] = sum(bool(r.on_time) for r in mine)
            done = [r for r in mine if r.outcome == "completed"]
            row[f"{name}_slot_s"] = sum(  # slot time held while both tenants were sending
                max(0.0, min(r.ended_at, c.duration_s) - r.dispatched_at) for r in done
            )
            waits = sorted(r.sojourn_s - r.service_s for r in done)
            row[f"{name}_wait_p50_s"] = waits[len(waits) // 2] if waits else None
    if c.ttft_ms > 0:
        row.update(first_token_row(c, trace))
    if c.keep_samples:
        done = [r for r in trace.records if r.outcome == "completed"]
        row["a_sojourns"] = [r.sojourn_s for r in done if r.cls is ContractClass.ASSURED]
        row["services"] = [r.service_s for r in done]
        row["o_admitted_per_s"] = m.opportunistic.admitted / c.duration_s
    if c.keep_ids:
        row["doomed_ids"] = sorted(
            r.request_id for r in trace.records if r.outcome == "dropped" and r.reason == "doomed"
        )
        row["on_time_ids"] = sorted(r.request_id for r in trace.records if r.on_time)
        row["doomed_causes"] = _doom_causes(trace)
    if c.detail:
        row["detail"] = [
            (
                r.arrival_at,
                r.ended_at if r.outcome == "completed" else None,
                r.outcome,
                r.deadline_at,
            )
            for r in trace.of_class(ContractClass.ASSURED)
        ]
    return row
