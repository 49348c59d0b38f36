"""Named scenarios: contracts, workload, backend and guard settings in one value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from floorguard.core.contract import (
    AffineEnvelope,
    CapacityAction,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    GuardConfig,
    MeterKind,
    QueueLimits,
    SurplusOrder,
    WindowSchedule,
)
from floorguard.errors import ConfigError, require
from floorguard.profiles import ServiceProfile, get_profile, tpot_slots
from floorguard.sim.traces import load_trace
from floorguard.sim.workloads import (
    Arrivals,
    ByFraction,
    FixedLength,
    PacedArrivals,
    PoissonArrivals,
    Stream,
    SyntheticStream,
    TraceLength,
    TraceStream,
)

__all__ = ["SCENARIOS", "Scenario", "create_scenario", "kv_pressure", "marquee", "trace_replay"]

ASSURED_TENANT = "a95"
"""The assured tenant's name in the catalogue scenarios ("A95" in reports)."""
OPPORTUNISTIC_TENANT = "a10"
POLITE_TENANT = "p02"
"""E20's second opportunistic tenant: a little traffic beside the flood."""
PACE_JITTER_S = 0.02
"""The marquee's paced assured arrivals are each late by up to 20 ms (docs/design.md §10's "small
jitter"; the size is ours)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    contracts: tuple[Contract, ...]
    streams: tuple[Stream, ...]
    profile: ServiceProfile
    slots: tuple[int, ...] = (4,)
    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    dispatch: DispatchOrder = DispatchOrder.ASSURED_FIRST
    surplus: SurplusOrder = SurplusOrder.FAIR
    meter: MeterKind = MeterKind.COUNT
    doom_gate: bool = True
    """Give the guard a lower envelope `L` (design §4.3): the profile's exact minimum `L(ℓ)`,
    or the constant `gate_lower_s`."""
    capacity_action: CapacityAction = CapacityAction.ALARM
    gate_lower_s: float | None = None
    """The published wiring: one constant `L` for every length (the batch-1 median)."""
    queue_limits: QueueLimits = field(default_factory=QueueLimits)
    """The surplus's queue limits and `refuse_busy` (none, off: the published wiring)."""
    kv_tokens: tuple[int | None, ...] = ()
    """Each backend's KV cache in tokens, budgeted by the guard (docs/design.md §16; empty: not)."""
    backend_kv_blocks: tuple[int | None, ...] = ()
    """Each simulated backend's own KV cache in blocks, which preempts as vLLM's does when
    it runs out (`KvBatchingBackend`; empty: none is modelled)."""
    kv_block_tokens: int = 16
    reserved_slots: int = 0
    """`r`: slots the guard keeps for the floor's first tokens (docs/design.md §19)."""
    backend_priorities: bool = False
    """The simulated KV caches schedule by priority, each request carrying its class's
    (vLLM `--scheduling-policy priority`, sent the class's priority by server priority or
    by a guard with `forward_priority`); off: vLLM's FCFS preemption."""

    def backend_priority_of(self) -> dict[str, int] | None:
        """Tenant → the priority its requests carry to the backend, or None (FCFS)."""
        if not self.backend_priorities:
            return None
        return {c.tenant: c.cls.backend_priority for c in self.contracts}

    def lower_envelope(self) -> AffineEnvelope | None:
        if not self.doom_gate:
            return None
        if self.gate_lower_s is not None:
            return AffineEnvelope(self.gate_lower_s, 0.0)
        return self.profile.lower

    def guard_config(self) -> GuardConfig:
        return GuardConfig(
            contracts=self.contracts,
            schedule=self.schedule,
            slots=tpot_slots(self.profile, self.slots, (c.tpot_budget_s for c in self.contracts)),
            dispatch=self.dispatch,
            surplus=self.surplus,
            meter=self.meter,
            lower_envelope=self.lower_envelope(),
            upper_envelope=self.profile.ceiling,
            capacity_action=self.capacity_action,
            queue_limits=self.queue_limits,
            kv_tokens=self.kv_tokens,
            kv_block_tokens=self.kv_block_tokens,
            reserved_slots=self.reserved_slots,
        )

    @property
    def slo_s(self) -> float:
        """The tightest contract's end-to-end budget for a 16-token request (the
        catalogue's; a TTFT/TPOT contract's is `ttft + tpot·16`): the learners' SLO."""
        return min(c.deadline_for(16) for c in self.contracts)

    def with_overrides(
        self,
        *,
        floor: int | None = None,
        slots: int | None = None,
        deadline_s: float | None = None,
        profile: str | None = None,
    ) -> Scenario:
        """The CLI's knobs: `B` of every assured contract, `C` of every backend, the deadline
        budget of every contract, the service profile."""
        contracts = tuple(
            replace(
                c,
                floor=floor if floor is not None and c.assured else c.floor,
                deadline_budget_s=deadline_s if deadline_s is not None else c.deadline_budget_s,
            )
            for c in self.contracts
        )
        return replace(
            self,
            contracts=contracts,
            slots=tuple(slots for _ in self.slots) if slots is not None else self.slots,
            profile=get_profile(profile) if profile is not None else self.profile,
        )


KV_PROMPT_TOKENS = 100
"""The memory-pressure workload's prompt length (every request's, both classes)."""
KV_OUTPUT_TOKENS = 64
"""Its output length ℓ."""


def kv_pressure(
    *,
    kv_blocks: int = 32,
    budget: bool = False,
    duration_s: float = 10.0,
    priorities: bool = False,
    floor: int = 3,
    block_tokens: int = 16,
    window_s: float = 1.0,
    opp_rate_per_s: float = 10.0,
    deadline_s: float = 2.5,
    profile: str = "v100-moe",
) -> Scenario:
    """Memory pressure (design §16): 100-token prompts and 64-token outputs, the assured tenant
    paced at B = `floor` per `window_s` window beside an opportunistic Poisson
    `opp_rate_per_s`, d = `deadline_s` for both, on one backend of C = 4 whose KV cache holds
    `kv_blocks` blocks of `block_tokens` (four running need 44 of 16 by their end);
    `budget`: the guard budgets that cache (`kv_tokens`); `priorities`: the cache preempts
    by each class's priority (`Scenario.backend_priorities`)."""
    lengths = FixedLength(KV_OUTPUT_TOKENS)
    return Scenario(
        name="kv-pressure",
        contracts=(
            Contract(ASSURED_TENANT, ContractClass.ASSURED, deadline_s, floor),
            Contract(OPPORTUNISTIC_TENANT, ContractClass.OPPORTUNISTIC, deadline_s),
        ),
        streams=(
            SyntheticStream(
                ASSURED_TENANT,
                PacedArrivals(floor / window_s),
                lengths,
                duration_s,
                prompt_tokens=KV_PROMPT_TOKENS,
            ),
            SyntheticStream(
                OPPORTUNISTIC_TENANT,
                PoissonArrivals(opp_rate_per_s),
                lengths,
                duration_s,
                prompt_tokens=KV_PROMPT_TOKENS,
            ),
        ),
        profile=get_profile(profile),
        slots=(4,),
        schedule=WindowSchedule(window_s),
        doom_gate=False,
        backend_kv_blocks=(kv_blocks,),
        kv_tokens=(kv_blocks * block_tokens,) if budget else (),
        kv_block_tokens=block_tokens,
        backend_priorities=priorities,
    )


def marquee(
    *,
    profile: str = "v100-moe",
    floor: int = 6,
    slots: int = 4,
    deadline_s: float = 1.820,
    duration_s: float = 12.0,
    assured_rate_per_s: float = 6.0,
    opportunistic_rate_per_s: float = 16.0,
    num_output_tokens: int = 16,
    excess_policy: ExcessPolicy = ExcessPolicy.REJECT,
    assured_poisson: bool = False,
) -> Scenario:
    """docs/design.md §10's marquee: B = 6 of C = 4 slots, the assured stream paced at 6/s (each
    arrival up to `PACE_JITTER_S` late, so every 1 s window offers exactly B) under an
    opportunistic Poisson flood of 16/s, ℓ = 16, d = 1820 ms for both classes, 12 s of
    arrivals. `assured_poisson` is the Poisson variant."""
    require(duration_s > 0, "duration_s", duration_s, "must be > 0")
    lengths = FixedLength(num_output_tokens)
    assured_arrivals: Arrivals = (
        PoissonArrivals(assured_rate_per_s)
        if assured_poisson
        else PacedArrivals(assured_rate_per_s, min(PACE_JITTER_S, 0.5 / assured_rate_per_s))
    )
    streams: list[Stream] = [
        SyntheticStream(ASSURED_TENANT, assured_arrivals, lengths, duration_s),
    ]
    if opportunistic_rate_per_s > 0:
        streams.append(
            SyntheticStream(
                OPPORTUNISTIC_TENANT, PoissonArrivals(opportunistic_rate_per_s), lengths, duration_s
            )
        )
    return Scenario(
        name="marquee",
        contracts=(
            Contract(ASSURED_TENANT, ContractClass.ASSURED, deadline_s, floor, excess_policy),
            Contract(OPPORTUNISTIC_TENANT, ContractClass.OPPORTUNISTIC, deadline_s),
        ),
        streams=tuple(streams),
        profile=get_profile(profile),
        slots=(slots,),
    )


def trace_replay(
    path: str,
    *,
    assured_fraction: float = 0.3,
    offset_s: float = 0.0,
    duration_s: float = 120.0,
    speedup: float = 1.0,
    max_tokens: int = 48,
    profile: str = "v100-moe",
    floor: int = 6,
    slots: int = 4,
    deadline_s: float = 1.820,
) -> Scenario:
    """Replay an Azure or BurstGPT trace slice, open loop at its own timestamps: each row is
    assured with probability `assured_fraction`, output capped at `max_tokens`."""
    require(max_tokens >= 1, "max_tokens", max_tokens, "must be ≥ 1")
    stream = TraceStream(
        load_trace(path),
        ByFraction(ASSURED_TENANT, OPPORTUNISTIC_TENANT, assured_fraction),
        TraceLength(cap=max_tokens),
        offset_s=offset_s,
        duration_s=duration_s,
        speedup=speedup,
    )
    return Scenario(
        name="trace",
        contracts=(
            Contract(ASSURED_TENANT, ContractClass.ASSURED, deadline_s, floor),
            Contract(OPPORTUNISTIC_TENANT, ContractClass.OPPORTUNISTIC, deadline_s),
        ),
        streams=(stream,),
        profile=get_profile(profile),
        slots=(slots,),
    )


def _light() -> Scenario:
    """The marquee's assured stream alone: the "light load" of docs/design.md §5."""
    return replace(marquee(opportunistic_rate_per_s=0), name="light")


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "marquee": marquee,
    "light": _light,
}
"""Scenarios that need no input; `trace_replay` needs a file and is built by the CLI."""


def create_scenario(name: str) -> Scenario:
    factory = SCENARIOS.get(name)
    if factory is None:
        raise ConfigError("scenario", name, f"must be one of {sorted(SCENARIOS)}")
    return factory()
