"""The static timing screen (SPEC §9): a cheap, deterministic first-moment prediction of the
assured sojourn, to *screen* a configuration against its percentile SLO — characterized, not
trusted as a proof (SPEC §1: P95 has no finite bad prefix and cannot be enforced).

Formulas (docs/screen.md). Per window `W`:

* admitted assured `n_a`: what the shipped credit store grants to `⌈λ_a·W⌉` arrivals
  (`min(B, ·)` under the guard's admission; all of them under admit-all);
* opportunistic `n_o = λ_o·W` (the admitted opportunistic load);
* `ahead`: requests the shipped dispatcher starts before or with the window's *last* assured
  arrival, found by running the dispatcher itself on one window's tickets in arrival order;
* `ρ̂ = (n_a + n_o)·ŝ / (C·W)`; the work that competes with assured requests is
  `ρ_rel = ahead·ŝ / (C·W)` (assured-first: `ρ_a`; FIFO: `ρ̂`);
* predicted sojourn `= ŝ · (r + ⌈ahead / C⌉)` if `ρ_rel ≤ 1`, else unbounded, where `r = 1`
  when other work not ahead of it can hold a slot (non-preemption), else 0.

Accept iff the prediction is within the deadline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from floorguard.analysis.records import fold_trace
from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    GuardConfig,
    WindowSchedule,
)
from floorguard.core.dispatcher import Ticket, create_dispatcher
from floorguard.core.events import read_jsonl
from floorguard.core.monitors import assumption_report
from floorguard.core.request import Request
from floorguard.errors import ConfigError, require
from floorguard.store.memory import MemoryCreditStore

__all__ = [
    "AGGREGATIONS",
    "AdmissionPolicy",
    "ScreenConfig",
    "ScreenVerdict",
    "aggregate",
    "read_service_samples",
    "screen",
    "service_only",
]

AGGREGATIONS = ("p50", "p99", "max", "mean", "median")


class AdmissionPolicy(StrEnum):
    GUARD = "guard"
    """The shipped reservation meter: at most `B` assured per window."""
    ADMIT_ALL = "admit-all"


@dataclass(frozen=True)
class ScreenConfig:
    floor: int
    """`B`."""
    slots: int
    """`C`."""
    service_s: float
    """`ŝ`, the service estimate (see `aggregate`)."""
    window_s: float = 1.0
    dispatch: DispatchOrder = DispatchOrder.ASSURED_FIRST
    admission: AdmissionPolicy = AdmissionPolicy.GUARD
    assured_rate_per_s: float | None = None
    """Offered assured rate; None: the floor is fully used, `B/W`."""
    opportunistic_rate_per_s: float = 0.0
    """Admitted opportunistic load `λ_o`."""
    s_max_s: float | None = None
    """Service ceiling for the §6 region check; None: `ŝ`."""

    def __post_init__(self) -> None:
        require(self.floor >= 1, "floor", self.floor, "must be an integer B ≥ 1")
        require(self.slots >= 1, "slots", self.slots, "must be an integer C ≥ 1")
        require(
            self.service_s > 0 and math.isfinite(self.service_s),
            "service_s",
            self.service_s,
            "must be a finite number of seconds > 0",
        )
        require(self.window_s > 0, "window_s", self.window_s, "must be > 0")
        require(
            self.opportunistic_rate_per_s >= 0,
            "opportunistic_rate_per_s",
            self.opportunistic_rate_per_s,
            "must be ≥ 0",
        )
        require(
            self.assured_rate_per_s is None or self.assured_rate_per_s >= 0,
            "assured_rate_per_s",
            self.assured_rate_per_s,
            "must be ≥ 0",
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], service_s: float | None = None) -> ScreenConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError("config", unknown, f"unknown keys; allowed: {sorted(known)}")
        values = dict(data)
        if service_s is not None:
            values["service_s"] = service_s
        if "service_s" not in values:
            raise ConfigError(
                "service_s", None, "give service_s in the config, or --service-samples"
            )
        dispatch = values.get("dispatch", "assured-first")
        values["dispatch"] = DispatchOrder("assured-first" if dispatch == "priority" else dispatch)
        values["admission"] = AdmissionPolicy(values.get("admission", "guard"))
        return cls(**values)


@dataclass(frozen=True)
class ScreenVerdict:
    accept: bool
    deadline_s: float
    predicted_sojourn_s: float
    """`math.inf` when the competing work exceeds capacity (ρ_rel > 1)."""
    service_s: float
    rho_hat: float
    rho_rel: float
    admitted_assured_per_window: int
    ahead: int
    waves: int
    residual: int
    inside_region: bool
    region_reasons: tuple[str, ...]
    reasons: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if math.isinf(self.predicted_sojourn_s):
            out["predicted_sojourn_s"] = None
        return out


def aggregate(samples: Sequence[float], how: str) -> float:
    """`ŝ` from service samples: p50, p99, max, mean or median."""
    require(how in AGGREGATIONS, "aggregation", how, f"must be one of {list(AGGREGATIONS)}")
    require(len(samples) > 0, "service_samples", len(samples), "need at least one sample")
    values = np.asarray(samples, dtype=float)
    if how == "max":
        return float(values.max())
    if how == "mean":
        return float(values.mean())
    return float(np.percentile(values, 99 if how == "p99" else 50))


def _admitted_assured(config: ScreenConfig, offered: int) -> int:
    """The shipped meter's grants to `offered` arrivals in one window."""
    if config.admission is AdmissionPolicy.ADMIT_ALL:
        return offered
    schedule, store = WindowSchedule(config.window_s), MemoryCreditStore()
    return sum(store.acquire("a", 1, config.floor, schedule, 0.0).granted for _ in range(offered))


def _ahead_of_last_assured(config: ScreenConfig, n_assured: int, n_opp: int) -> tuple[int, bool]:
    """Run the shipped dispatcher on one window's tickets (arrivals spread evenly, assured
    last at a tie): how many start before or with the last assured one, and whether any
    other ticket is left behind it (one of which may then hold a slot: non-preemption)."""
    dispatcher = create_dispatcher(config.dispatch)
    entries = [(i / max(n_assured, 1), 1, True) for i in range(1, n_assured + 1)]
    entries += [(j / max(n_opp, 1), 0, False) for j in range(1, n_opp + 1)]
    contract = Contract("a", ContractClass.ASSURED, 1.0, max(config.floor, 1))
    for seq, (at, _, assured) in enumerate(sorted(entries), start=1):
        dispatcher.push(Ticket(Request(seq, "a", at, 1), contract, math.inf, assured, 0, seq))
    order = []
    while (ticket := dispatcher.pop()) is not None:
        order.append(ticket)
    last = max((i for i, t in enumerate(order) if t.entitled), default=-1)
    return last + 1, last + 1 < len(order)


def screen(config: ScreenConfig, deadline_s: float) -> ScreenVerdict:
    """Accept iff the predicted assured sojourn is within `deadline_s` (docs/screen.md)."""
    require(deadline_s > 0, "deadline_s", deadline_s, "must be > 0")
    w, s, c = config.window_s, config.service_s, config.slots
    assured_rate = (
        config.assured_rate_per_s if config.assured_rate_per_s is not None else config.floor / w
    )
    n_a = _admitted_assured(config, math.ceil(assured_rate * w - 1e-9))
    n_o = round(config.opportunistic_rate_per_s * w)
    rho_hat = (n_a + config.opportunistic_rate_per_s * w) * s / (c * w)
    ahead, others_behind = _ahead_of_last_assured(config, n_a, n_o)
    rho_rel = ahead * s / (c * w)
    waves = math.ceil(ahead / c)
    residual = 1 if others_behind else 0
    reasons = [
        f"ŝ = {s * 1e3:.0f} ms, ρ̂ = {rho_hat:.2f}, {ahead} request(s) start before or "
        f"with the window's last assured one ({config.dispatch.value} dispatch)"
    ]
    if rho_rel > 1:
        predicted = math.inf
        reasons.append(
            f"ρ_rel = {rho_rel:.2f} > 1: the work ahead of assured requests grows without bound"
        )
    else:
        predicted = s * (residual + waves)
        reasons.append(
            f"predicted sojourn ŝ·({residual} + ⌈{ahead}/{c}⌉) = {predicted * 1e3:.0f} ms"
        )
    accept = predicted <= deadline_s
    reasons.append(f"{'≤' if accept else '>'} deadline {deadline_s * 1e3:.0f} ms")
    inside, region_reasons = _region(config, deadline_s)
    return ScreenVerdict(
        accept,
        deadline_s,
        predicted,
        s,
        rho_hat,
        rho_rel,
        n_a,
        ahead,
        waves,
        residual,
        inside,
        region_reasons,
        tuple(reasons),
    )


def _region(config: ScreenConfig, deadline_s: float) -> tuple[bool, tuple[str, ...]]:
    """SPEC §6, which assumes the guard's meter and assured-first dispatch."""
    reasons: list[str] = []
    if config.admission is not AdmissionPolicy.GUARD:
        reasons.append("§6 assumes the reservation meter (A1); admission is admit-all")
    if config.dispatch is not DispatchOrder.ASSURED_FIRST:
        reasons.append("§6 assumes assured-first dispatch (A2); dispatch is FIFO")
    s_max = config.s_max_s if config.s_max_s is not None else config.service_s
    guard_config = GuardConfig(
        contracts=(Contract("a", ContractClass.ASSURED, deadline_s, config.floor),),
        schedule=WindowSchedule(config.window_s),
        slots=(config.slots,),
        upper_envelope=AffineEnvelope(s_max, 0.0),
    )
    report = assumption_report(guard_config, num_output_tokens=0)
    reasons += report.reasons
    return not reasons, tuple(reasons)


def read_service_samples(path: str) -> list[float]:
    """Service times in seconds: one number per line, a JSON list, or a decision log (JSONL
    trace), whose dispatch → complete intervals are taken."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("{"):
        records = fold_trace(read_jsonl(path)).records
        return [r.service_s for r in records if r.outcome == "completed"]
    try:
        values = (
            json.loads(text)
            if stripped.startswith("[")
            else [float(line) for line in text.splitlines() if line.strip()]
        )
    except ValueError as exc:
        raise ConfigError(
            "service_samples", path, f"not numbers, a JSON list or a trace ({exc})"
        ) from exc
    return [float(v) for v in values]


def service_only(service_s: float, deadline_s: float) -> bool:
    """The service-only baseline screen: accept iff ŝ ≤ D."""
    return service_s <= deadline_s
