"""The static timing screens (docs/design.md §9): cheap, deterministic predictions of the assured
sojourn, to *screen* a configuration against its percentile SLO — characterized, not trusted
as a proof (design §1: P95 has no finite bad prefix and cannot be enforced). Two models behind
one interface, `screen(config, deadline_s, model)` (docs/screen.md has the formulas):

* `first-moment`, the published kind: mean service `ŝ`, a mean wait from the admitted rate
  (Cobham's non-preemptive priority formula on the `C` slots seen as one server of rate
  `C/ŝ`, no service variance), no tail. It predicts a *typical* sojourn.
* `makespan`, floorguard's own conservative one: the window's work ahead of its last assured
  request, `ŝ·(r + ⌈ahead/C⌉)`, unbounded once the competing load exceeds capacity.

Both read admission and dispatch off the shipped code, never a copy: the assured requests
admitted per window are what the shipped credit store grants, and the work that competes
with an assured request is what the shipped dispatcher starts before it (`ahead`, found by
running the dispatcher on one window's tickets in arrival order).

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
    "DEFAULT_MODEL",
    "AdmissionPolicy",
    "Prediction",
    "ScreenConfig",
    "ScreenModel",
    "ScreenVerdict",
    "aggregate",
    "predict",
    "read_service_samples",
    "screen",
    "service_only",
]

AGGREGATIONS = ("p50", "p99", "max", "mean", "median")


class ScreenModel(StrEnum):
    FIRST_MOMENT = "first-moment"
    """The published kind: mean service and a mean wait from the admitted rate."""
    MAKESPAN = "makespan"
    """floorguard's conservative window-makespan bound."""


DEFAULT_MODEL = ScreenModel.MAKESPAN
"""The model `floorguard screen` uses unless told: the one whose accepts the evaluation
(E17, E18) shows can be trusted (docs/screen.md)."""


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
    model: ScreenModel
    accept: bool
    deadline_s: float
    predicted_sojourn_s: float
    """`math.inf` when the competing work exceeds capacity (ρ_rel ≥ 1; makespan: > 1)."""
    service_s: float
    rho_hat: float
    """(admitted assured + opportunistic)·ŝ / (C·W)."""
    rho_rel: float
    """The load that competes with an assured request (assured-first: ρ_a; FIFO: ρ̂)."""
    admitted_assured_per_window: int
    ahead: int
    """Requests the shipped dispatcher starts before or with a window's last assured one."""
    terms: dict[str, float]
    """The model's own terms: makespan `waves`, `residual`; first-moment `wait_s`,
    `residual_work_s`."""
    inside_region: bool
    region_reasons: tuple[str, ...]
    reasons: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model"] = self.model.value
        if math.isinf(self.predicted_sojourn_s):
            out["predicted_sojourn_s"] = None
        out["terms"] = {k: (None if math.isinf(v) else v) for k, v in self.terms.items()}
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


@dataclass(frozen=True)
class Prediction:
    """A model's deadline-free prediction for one configuration."""

    model: ScreenModel
    sojourn_s: float
    """`math.inf`: unbounded."""
    rho_hat: float
    rho_rel: float
    admitted_assured_per_window: int
    ahead: int
    terms: dict[str, float]
    reasons: tuple[str, ...]


def predict(config: ScreenConfig, model: ScreenModel | str = DEFAULT_MODEL) -> Prediction:
    """`model`'s predicted assured sojourn for `config` (no deadline involved)."""
    model = ScreenModel(model)
    w, s, c = config.window_s, config.service_s, config.slots
    assured_rate = (
        config.assured_rate_per_s if config.assured_rate_per_s is not None else config.floor / w
    )
    n_a = _admitted_assured(config, math.ceil(assured_rate * w - 1e-9))
    n_o = round(config.opportunistic_rate_per_s * w)
    rho_hat = (n_a + config.opportunistic_rate_per_s * w) * s / (c * w)
    ahead, others_behind = _ahead_of_last_assured(config, n_a, n_o)
    reasons = [
        f"{model.value}: ŝ = {s * 1e3:.0f} ms, ρ̂ = {rho_hat:.2f}, {ahead} request(s) start "
        f"before or with the window's last assured one ({config.dispatch.value} dispatch)"
    ]
    if model is ScreenModel.FIRST_MOMENT:
        sojourn, rho_rel, terms = _first_moment(config, n_a, rho_hat, reasons)
    else:
        sojourn, rho_rel, terms = _makespan(config, ahead, others_behind, reasons)
    return Prediction(model, sojourn, rho_hat, rho_rel, n_a, ahead, terms, tuple(reasons))


def screen(
    config: ScreenConfig, deadline_s: float, model: ScreenModel | str = DEFAULT_MODEL
) -> ScreenVerdict:
    """Accept iff `model`'s predicted assured sojourn is within `deadline_s`."""
    require(deadline_s > 0, "deadline_s", deadline_s, "must be > 0")
    p = predict(config, model)
    accept = p.sojourn_s <= deadline_s
    reason = f"{'≤' if accept else '>'} deadline {deadline_s * 1e3:.0f} ms"
    inside, region_reasons = _region(config, deadline_s)
    return ScreenVerdict(
        p.model,
        accept,
        deadline_s,
        p.sojourn_s,
        config.service_s,
        p.rho_hat,
        p.rho_rel,
        p.admitted_assured_per_window,
        p.ahead,
        p.terms,
        inside,
        region_reasons,
        (*p.reasons, reason),
    )


def _makespan(
    config: ScreenConfig, ahead: int, others_behind: bool, reasons: list[str]
) -> tuple[float, float, dict[str, float]]:
    """`ŝ·(r + ⌈ahead/C⌉)` while `ρ_rel = ahead·ŝ/(C·W) ≤ 1`, else unbounded."""
    s, c = config.service_s, config.slots
    rho_rel = ahead * s / (c * config.window_s)
    waves = math.ceil(ahead / c)
    residual = 1 if others_behind else 0
    terms = {"waves": float(waves), "residual": float(residual)}
    if rho_rel > 1:
        reasons.append(
            f"ρ_rel = {rho_rel:.2f} > 1: the work ahead of assured requests grows without bound"
        )
        return math.inf, rho_rel, terms
    predicted = s * (residual + waves)
    reasons.append(f"predicted sojourn ŝ·({residual} + ⌈{ahead}/{c}⌉) = {predicted * 1e3:.0f} ms")
    return predicted, rho_rel, terms


def _first_moment(
    config: ScreenConfig, n_a: int, rho_hat: float, reasons: list[str]
) -> tuple[float, float, dict[str, float]]:
    """`ŝ + R/(1 − ρ_rel)`: Cobham's mean wait in a non-preemptive priority queue, the `C`
    slots as one server of rate `C/ŝ` with no service variance, so the mean residual work
    an arrival finds is `R = min(ρ̂, 1)·ŝ/(2C)`. What competes (`ρ_rel`) is read off the
    shipped dispatcher: the share of a window's opportunistic requests it starts ahead of
    the last assured one (assured-first: none; FIFO: all)."""
    s, c, w = config.service_s, config.slots, config.window_s
    probe = max(round(config.opportunistic_rate_per_s * w), 1)
    ahead, _ = _ahead_of_last_assured(config, n_a, probe)
    share = (ahead - n_a) / probe
    rho_rel = (n_a / w + share * config.opportunistic_rate_per_s) * s / c
    residual_work = min(rho_hat, 1.0) * s / (2 * c)
    if rho_rel >= 1:
        reasons.append(f"ρ_rel = {rho_rel:.2f} ≥ 1: the mean wait is unbounded")
        return math.inf, rho_rel, {"wait_s": math.inf, "residual_work_s": residual_work}
    wait = residual_work / (1 - rho_rel)
    reasons.append(
        f"predicted sojourn ŝ + R/(1 − ρ_rel) = {s * 1e3:.0f} + {residual_work * 1e3:.0f}/"
        f"(1 − {rho_rel:.2f}) = {(s + wait) * 1e3:.0f} ms"
    )
    return s + wait, rho_rel, {"wait_s": wait, "residual_work_s": residual_work}


def _region(config: ScreenConfig, deadline_s: float) -> tuple[bool, tuple[str, ...]]:
    """docs/design.md §6, which assumes the guard's meter and assured-first dispatch."""
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
