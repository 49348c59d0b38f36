"""Online monitors (design §4.4) and the §6 assumption report. They return values; they never
log, and they never change a decision (the capacity action is the guard's, not theirs)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from floorguard.core.contract import AffineEnvelope, GuardConfig, WindowSchedule

if TYPE_CHECKING:
    from floorguard.core.surface import Stack

__all__ = [
    "DEFAULT_REPORT_TOKENS",
    "AssumptionReport",
    "BacklogMonitor",
    "CapacityMonitor",
    "EnvelopeMonitor",
    "FirstTokenReport",
    "assumption_report",
    "assumptions_of",
    "first_token_of",
    "first_token_report",
]


class EnvelopeMonitor:
    """Observed service against the envelope: `s > s_max(ℓ)` and `s < L(ℓ)` are counted."""

    def __init__(self, lower: AffineEnvelope | None, upper: AffineEnvelope | None) -> None:
        self._lower = lower
        self._upper = upper
        self.num_observed = 0
        self.num_above_upper = 0
        self.num_below_lower = 0
        self.max_service_s = 0.0
        self.max_upper_ratio = 0.0
        """max of s / s_max(ℓ): above 1 means A3 of §6 failed at least once."""

    def observe(
        self,
        num_output_tokens: int,
        service_s: float,
        prompt_lower: int = 0,
        prompt_upper: int = 0,
    ) -> None:
        """`prompt_lower` / `prompt_upper`: bounds on the prompt's tokens, for `L` / `s_max`."""
        lower, upper = self._lower, self._upper
        self.observe_bounds(
            service_s,
            lower.at(num_output_tokens, prompt_lower) if lower is not None else None,
            upper.at(num_output_tokens, prompt_upper) if upper is not None else None,
        )

    def observe_bounds(
        self, service_s: float, lower_s: float | None, upper_s: float | None
    ) -> None:
        """One service against its own `L` and `s_max` (a ticket's, computed at admission)."""
        self.num_observed += 1
        self.max_service_s = max(self.max_service_s, service_s)
        if lower_s is not None and service_s < lower_s:
            self.num_below_lower += 1
        if upper_s is not None:
            if service_s > upper_s:
                self.num_above_upper += 1
            if upper_s > 0 and service_s / upper_s > self.max_upper_ratio:
                self.max_upper_ratio = service_s / upper_s


class BacklogMonitor:
    """The assured backlog `Q_A` (floor-entitled requests queued, not yet started) vs `B`."""

    def __init__(self, total_floor: int) -> None:
        self.total_floor = total_floor
        self.backlog = 0
        self.max_backlog = 0
        self.num_over_floor = 0
        """How many times `Q_A` rose above `B` (the §6 backlog precondition failed)."""

    def on_enqueue(self) -> None:
        self.backlog += 1
        self.max_backlog = max(self.max_backlog, self.backlog)
        if self.backlog > self.total_floor:
            self.num_over_floor += 1

    def on_dequeue(self) -> None:
        self.backlog -= 1


class CapacityMonitor:
    """A capacity estimate `μ̂` (completions per second) from busy windows only.

    A window counts when work was queued at one of its completions, so the backend was the
    bottleneck; its completions / W feed an exponentially weighted mean. An alarm is raised
    for each busy window that closes with `μ̂ · W < B` (docs/design.md §4.4).
    """

    def __init__(self, schedule: WindowSchedule, total_floor: int, weight: float = 0.5) -> None:
        self._schedule = schedule
        self.total_floor = total_floor
        self._weight = weight
        self._window = -1
        self._count = 0
        self._busy = False
        self.estimate_per_s: float | None = None
        self.num_alarms = 0

    def on_complete(self, now: float, num_queued: int) -> None:
        index = self._schedule.index_at(now)
        if index != self._window:
            self._close()
            self._window, self._count, self._busy = index, 0, False
        self._count += 1
        self._busy = self._busy or num_queued > 0

    def _close(self) -> None:
        if not self._busy:
            return
        rate = self._count / self._schedule.window_s
        previous = self.estimate_per_s
        self.estimate_per_s = (
            rate if previous is None else (self._weight * rate + (1 - self._weight) * previous)
        )
        if self.estimate_per_s * self._schedule.window_s < self.total_floor:
            self.num_alarms += 1


@dataclass(frozen=True, slots=True)
class AssumptionReport:
    """Whether a configuration lies inside the region where docs/design.md §6's bound holds."""

    rho_a: float | None
    """`B·s_max / (C·W)`; A4 needs ≤ 1."""
    bound_s: float | None
    """`s_max · (1 + ⌈B/C⌉)`: the sojourn bound inside the region."""
    s_max_s: float | None
    min_deadline_budget_s: float | None
    max_service_s: float | None
    max_backlog: int | None
    inside: bool
    reasons: tuple[str, ...]
    """Every assumption that fails, in words; empty when inside."""


def assumption_report(
    config: GuardConfig,
    *,
    num_output_tokens: int,
    max_service_s: float | None = None,
    num_above_ceiling: int = 0,
    max_backlog: int | None = None,
    num_prompt_tokens: int = 0,
) -> AssumptionReport:
    """docs/design.md §6 for `ℓ = num_output_tokens` (and prompts of `num_prompt_tokens`), plus what
    was observed: the largest service, how many services exceeded `s_max(ℓ)` at their own
    ℓ, and the largest `Q_A`. Under a KV budget (docs/design.md §16) `C` is what the caches run at
    once of such requests: per backend `min(C, ⌊kv_tokens / reservation⌋)`."""
    floor, slots, window_s = config.total_floor, config.total_slots, config.schedule.window_s
    budgets = [c.deadline_for(num_output_tokens) for c in config.contracts if c.assured]
    min_budget = min(budgets) if budgets else None
    reasons: list[str] = []
    if config.kv_budgeted:
        need = config.kv_reservation(num_prompt_tokens, num_output_tokens)
        slots = sum(
            c if kv is None else min(c, kv // need)
            for c, kv in zip(config.slots, config.kv_tokens, strict=True)
        )
        if slots < config.total_slots:
            reasons.append(
                f"memory: the KV caches run {slots} of C = {config.total_slots} at once at "
                f"p + ℓ = {num_prompt_tokens} + {num_output_tokens}"
            )
        if slots == 0:
            return AssumptionReport(
                None, None, None, min_budget, max_service_s, max_backlog, False, tuple(reasons)
            )
    if config.upper_envelope is None:
        return AssumptionReport(
            None,
            None,
            None,
            min_budget,
            max_service_s,
            max_backlog,
            False,
            ("no service ceiling s_max configured",),
        )
    s_max = config.upper_envelope.at(num_output_tokens, num_prompt_tokens)
    rho_a = floor * s_max / (slots * window_s)
    bound = s_max * (1 + math.ceil(floor / slots))
    if rho_a > 1:
        reasons.append(f"A4 stability: rho_a = {rho_a:.3f} > 1")
    if min_budget is not None and min_budget < bound:
        reasons.append(f"deadline: d = {min_budget:.3f} s < s_max·(1+⌈B/C⌉) = {bound:.3f} s")
    if num_above_ceiling > 0:
        reasons.append(f"A3 envelope: {num_above_ceiling} services exceeded s_max(ℓ)")
    if max_backlog is not None and max_backlog > floor:
        reasons.append(f"backlog: max Q_A = {max_backlog} > B = {floor}")
    memory = [r for r in reasons if r.startswith("memory:")]
    outside = [r for r in reasons if not r.startswith("memory:")]
    return AssumptionReport(
        rho_a,
        bound,
        s_max,
        min_budget,
        max_service_s,
        max_backlog,
        not outside,
        tuple(outside + memory) if outside else (),
    )


@dataclass(frozen=True, slots=True)
class FirstTokenReport:
    """Whether a configuration lies inside the region where the first-token bound of
    docs/design.md §19 holds, for the tightest TTFT of its assured contracts."""

    reserved: int
    """`r`, the slots kept for the floor."""
    rho_r: float | None
    """`ΣB·s_max(ℓ_A, p_A) / (r·W)`: the floor's work against its reserved slots; ≤ 1."""
    bound_s: float | None
    """`⌈ΣB/r⌉·s_max(ℓ_A, p_A) + s_max(1, p_A)`: the first-token bound inside the region."""
    min_ttft_s: float
    inside: bool
    reasons: tuple[str, ...]
    """Every assumption that fails, in words; empty when inside."""


def first_token_report(
    config: GuardConfig,
    *,
    num_output_tokens: int,
    num_prompt_tokens: int = 0,
    num_above_ceiling: int = 0,
    max_backlog: int | None = None,
) -> FirstTokenReport | None:
    """docs/design.md §19 for assured requests of ℓ output and `p` prompt tokens, with what
    was observed (services above `s_max`, the largest `Q_A`); None when no assured contract
    has a TTFT. The floor's requests present hold at most `B` waves of the `r` reserved
    slots, each at most `s_max(ℓ_A, p_A)` — the surplus on a reserved slot leaves by the
    window's end, so none is running there when the floor's credits return — then its own
    first token comes within `s_max(1, p_A)` of its start."""
    budgets = [c.ttft_budget_s for c in config.contracts if c.assured and c.ttft_budget_s]
    if not budgets:
        return None
    floor, reserved, window_s = config.total_floor, config.kept_slots, config.schedule.window_s
    min_ttft = min(budgets)
    if config.upper_envelope is None:
        reasons = ("no service ceiling s_max configured",)
        return FirstTokenReport(reserved, None, None, min_ttft, False, reasons)
    if reserved == 0:
        reasons = (
            "no reserved slots (reserved_slots = 0): a first token may wait out the longest "
            "surplus decode running, which nothing in the floor bounds",
        )
        return FirstTokenReport(reserved, None, None, min_ttft, False, reasons)
    upper = config.upper_envelope
    s_max = upper.at(num_output_tokens, num_prompt_tokens)
    rho_r = floor * s_max / (reserved * window_s)
    bound = math.ceil(floor / reserved) * s_max + upper.at(1, num_prompt_tokens)
    out: list[str] = []
    if rho_r > 1:
        out.append(f"stability: ρ_r = ΣB·s_max/(r·W) = {rho_r:.3f} > 1")
    if min_ttft < bound:
        out.append(f"ttft: {min_ttft:.3f} s < ⌈B/r⌉·s_max(ℓ, p) + s_max(1, p) = {bound:.3f} s")
    if num_above_ceiling > 0:
        out.append(f"A3 envelope: {num_above_ceiling} services exceeded s_max(ℓ)")
    if max_backlog is not None and max_backlog > floor:
        out.append(f"backlog: max Q_A = {max_backlog} > B = {floor}")
    return FirstTokenReport(reserved, rho_r, bound, min_ttft, not out, tuple(out))


DEFAULT_REPORT_TOKENS = 1
"""The ℓ the §6 report is made for before any assured request arrived: the smallest
request (a run with no assured traffic is inside the region by what it asked for)."""


def assumptions_of(config: GuardConfig, runs: Iterable[Stack]) -> AssumptionReport:
    """design §6 for `config` and what one or more runs of it observed: the largest assured ℓ
    (`DEFAULT_REPORT_TOKENS` before any), the largest service, the services above `s_max(ℓ)`,
    the largest `Q_A`."""
    runs = list(runs)
    observed = [r for r in runs if r.envelope.num_observed]
    return assumption_report(
        config,
        num_output_tokens=max((r.max_assured_tokens for r in runs), default=0)
        or DEFAULT_REPORT_TOKENS,
        max_service_s=max(r.envelope.max_service_s for r in observed) if observed else None,
        num_above_ceiling=sum(r.envelope.num_above_upper for r in runs),
        max_backlog=max((r.backlog.max_backlog for r in runs), default=None),
        num_prompt_tokens=max((r.max_assured_prompt_tokens for r in runs), default=0),
    )


def first_token_of(config: GuardConfig, runs: Iterable[Stack]) -> FirstTokenReport | None:
    """docs/design.md §19 for `config` and what one or more runs of it observed (as
    `assumptions_of`)."""
    runs = list(runs)
    return first_token_report(
        config,
        num_output_tokens=max((r.max_assured_tokens for r in runs), default=0)
        or DEFAULT_REPORT_TOKENS,
        num_prompt_tokens=max((r.max_assured_prompt_tokens for r in runs), default=0),
        num_above_ceiling=sum(r.envelope.num_above_upper for r in runs),
        max_backlog=max((r.backlog.max_backlog for r in runs), default=None),
    )
