"""The experiments' records, typed: a simulated run's row (`RunRow`) and a condition's
summary over its reps (`Summary`), the two things a reading, a table's extra or a figure
reads. At run time they are plain dicts — `runs.csv` and `runs.jsonl` are written from them
as before — but mypy checks every key a reading names, so a renamed or misspelt key breaks
the type check, not the report; `run_row` refuses, when a run ends, a row with a key the
record does not declare."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from floorguard.analysis.stats import Interval
from floorguard.core.request import RequestId

__all__ = ["CONDITION_KEYS", "RUN_KEYS", "RunRow", "Summary", "run_row"]


class ConditionKeys(TypedDict):
    """The grid's knobs (`experiments.conditions.Condition`'s fields that label a run;
    a test holds the two equal)."""

    policy: str
    learner: str
    beta: float
    profile: str
    floor: int
    slots: int
    deadline_ms: float
    window_s: float
    workload: str
    duration_s: float
    assured_rate: float
    opp_rate: float
    tokens: int
    long_tokens: int
    long_fraction: float
    excess: str
    meter: str
    doom_gate: bool
    gate_lower_ms: float
    capacity_action: str
    mapping_fault: str
    low_band_priority: int
    queue_ttl_s: float
    assured_poisson: bool
    predictor: str
    replay_admission: bool
    cv: float
    trace_path: str
    slice_index: int
    slice_s: float
    speedup: float
    assured_fraction: float
    max_tokens: int
    burst_size: int
    burst_assured: int
    surplus: str
    polite_rate: float
    polite_prompt_tokens: int
    flood_tokens: int
    ttft_ms: float
    tpot_ms: float
    reserved_slots: int
    static_caps_at_capacity: bool
    kv_blocks: int
    kv_block_tokens: int
    kv_budget: bool
    forward_priority: bool


class RunRow(ConditionKeys, total=False):
    """One seeded run of a condition (`run_condition`): its condition, its seed and rep,
    each class's counts and ratios (`a_…` assured, `o_…` opportunistic), the floor's
    attainment, the monitors' readings, and the extras a condition asks for."""

    detail: bool | list[tuple[float, float | None, str, float]]
    """The condition's flag; with it set, each assured request's (arrival, end or None,
    outcome, deadline)."""
    keep_samples: bool
    keep_ids: bool
    seed: int
    a_offered: int
    a_admitted: int
    a_rejected: int
    a_dropped: int
    a_late: int
    a_failed: int
    a_aborted: int
    a_completed: int
    a_miss: float | None
    a_unmet: float | None
    a_sojourn_p50_s: float | None
    a_sojourn_p95_s: float | None
    a_sojourn_p99_s: float | None
    a_queue_wait_p50_s: float | None
    a_queue_wait_p99_s: float | None
    a_service_mean_s: float | None
    a_service_max_s: float | None
    o_offered: int
    o_admitted: int
    o_rejected: int
    o_dropped: int
    o_late: int
    o_failed: int
    o_aborted: int
    o_completed: int
    o_miss: float | None
    o_unmet: float | None
    o_sojourn_p50_s: float | None
    o_sojourn_p95_s: float | None
    o_sojourn_p99_s: float | None
    o_queue_wait_p50_s: float | None
    o_queue_wait_p99_s: float | None
    o_service_mean_s: float | None
    o_service_max_s: float | None
    entitled: int
    entitled_met: int
    entitled_admitted: int
    preemptions: int
    """Sequences the simulated backends' KV caches preempted (E21)."""
    a_preempted: int
    """Of those, the assured tenant's."""
    attainment: float | None
    attainment_worst_phase: float | None
    worst_phase_s: float
    rho_eff: float
    mu_sat: float
    rho_emp: float
    rho_hat: float
    max_assured_backlog: int
    goodput_per_s: float
    span_s: float
    fire_cv: float
    max_fire_lag_s: float
    dr_firings: int
    dr_firings_assured: int
    false_drops: int
    a_wait_growth_ms_per_s: float | None
    a_short_admitted: int
    a_short_late: int
    count_entitled_shed: int
    capacity_alarms: int | None
    max_service_s: float
    num_above_ceiling: int
    rho_a: float
    bound_s: float
    inside_region: bool
    ft_bound_s: float | None
    """docs/design.md §19's first-token bound for the run (None: no TTFT, or no bound)."""
    ft_inside: bool | None
    """Inside §19's first-token region (None: the condition has no TTFT)."""
    held: bool
    phase_counts: list[tuple[float, int, int]]
    """Per window-origin offset φ: (φ, floor-entitled met, floor-entitled)."""
    rep: int
    admission_identical: bool
    """E3: the replayed FIFO run admitted exactly the guard run's set."""
    a_sojourns: list[float]
    """`keep_samples`."""
    services: list[float]
    """`keep_samples`."""
    o_admitted_per_s: float
    """`keep_samples`."""
    polite_offered: int
    """E20 (`polite`): the polite tenant's requests, and below them the flooder's."""
    polite_admitted: int
    polite_on_time: int
    flood_offered: int
    flood_admitted: int
    flood_on_time: int
    polite_slot_s: float
    """E20: the slot time each tenant's completed requests held while the tenants were
    sending (until `duration_s`), and their median queue wait (None: none completed)."""
    polite_wait_p50_s: float | None
    flood_slot_s: float
    flood_wait_p50_s: float | None
    doomed_ids: list[RequestId]
    """`keep_ids`."""
    on_time_ids: list[RequestId]
    """`keep_ids`."""
    ttft_entitled: int
    """E23 (`ttft_ms`): the floor-entitled requests (the contract's first `B` a window),
    and those whose first token came by arrival + TTFT."""
    ttft_met: int
    a_ttft_p99_s: float | None
    """The assured first tokens' p99 and largest, from arrival."""
    a_ttft_max_s: float | None
    a_tpot_p99_s: float | None
    """The assured answers' time per output token after the first, p99."""
    o_tokens_per_s: float
    """The surplus's output tokens produced while the flood was offered, per second."""
    doomed_causes: dict[str, int]
    """`keep_ids`: the doomed drops by what kept each waiting (`assured`: an assured
    request; `overtaken`: an opportunistic one an assured request arriving after it went
    ahead of; `queued`: an opportunistic one behind what was admitted before it)."""


class Summary(ConditionKeys):
    """One condition over its reps (`tables.summarize`): counts summed, the assured miss
    and the held fraction as intervals, the rest pooled, averaged or the worst rep's."""

    runs: int
    a_offered: int
    a_admitted: int
    a_rejected: int
    a_dropped: int
    a_late: int
    miss: Interval
    unmet: float | None
    held: Interval
    attainment: float | None
    worst_phase: float | None
    worst_phase_ms: float
    rho_eff: float | None
    rho_emp: float | None
    rho_hat: float | None
    wait_growth_ms_per_s: float | None
    max_qa: int
    dr_firings: int
    wait_p99_ms: float | None
    sojourn_p99_ms: float | None
    max_service_ms: float | None
    o_unmet: float | None
    inside_region: bool
    fire_cv: float | None
    max_fire_lag_ms: float


CONDITION_KEYS = frozenset(ConditionKeys.__annotations__)
RUN_KEYS = frozenset(RunRow.__annotations__) | CONDITION_KEYS


def run_row(row: Mapping[str, Any]) -> RunRow:
    """`row` as a `RunRow`, or a `KeyError` naming each key the record does not declare (a
    producer renamed one, and every reading of it would read nothing)."""
    unknown = row.keys() - RUN_KEYS
    if unknown:
        raise KeyError(f"a run's row has keys RunRow does not declare: {sorted(unknown)}")
    return cast(RunRow, row)
