"""E11: capacity degradation — a fixed, a lowered and an adaptive floor."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from floorguard.experiments.catalogue._common import _fmt3, _per_condition
from floorguard.experiments.conditions import Condition, mu_sat_of
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize
from floorguard.profiles import get_profile
from floorguard.screen.model import ScreenConfig, ScreenModel, ScreenVerdict, aggregate, screen
from floorguard.sim.targets import flood_services


def _e11(quick: bool) -> list[Condition]:
    out = []
    for slots in (4, 1):
        out += [
            Condition(slots=slots, duration_s=20.0, capacity_action="alarm"),
            Condition(slots=slots, duration_s=20.0, floor=4, capacity_action="alarm"),
            Condition(slots=slots, duration_s=20.0, capacity_action="lower-floor"),
        ]
    return out


_E11_CONFIGURED_SLOTS = 4
"""What the operator knows before the run: the configuration as configured, healthy C."""


@functools.cache
def _e11_verdicts() -> tuple[float, tuple[tuple[int, ScreenVerdict], ...]]:
    """ŝ and each static screen's verdict on each floor, before the run, on what the
    operator knows then (docs/design.md §11): the configured, healthy C = 4 and ŝ = the p99 of the
    healthy backend's flood services. The batch cap comes at run time, unseen by them."""
    service_s = aggregate(flood_services(get_profile("v100-moe"), 4), "p99")
    verdicts = tuple(
        (
            floor,
            screen(
                ScreenConfig(
                    floor=floor,
                    slots=_E11_CONFIGURED_SLOTS,
                    service_s=service_s,
                    assured_rate_per_s=6.0,
                    opportunistic_rate_per_s=16.0,
                ),
                1.82,
                model,
            ),
        )
        for floor in (6, 4)
        for model in ScreenModel
    )
    return service_s, verdicts


def _e11_screen(rows: Sequence[RunRow]) -> str:
    healthy, degraded = mu_sat_of("v100-moe", 4), mu_sat_of("v100-moe", 1)
    service_s, verdicts = _e11_verdicts()
    lines = [
        f"Measured μ_sat: C = 4 {healthy:.2f}/s, C = 1 {degraded:.2f}/s (a "
        f"{1 - degraded / healthy:.0%} cut). Both screens before the run, on what the operator "
        f"knows then: the configuration as configured (C = {_E11_CONFIGURED_SLOTS}), ŝ = p99 of "
        f"the healthy flood services ({service_s * 1e3:.0f} ms), opportunistic 16/s admitted, "
        "d = 1820 ms. The cap to C = 1 comes at run time; no static screen sees it:",
        "",
        "| B | screen | verdict | predicted sojourn (ms) | reasons |",
        "|---|---|---|---|---|",
    ]
    for floor, verdict in verdicts:
        predicted = verdict.predicted_sojourn_s
        lines.append(
            f"| {floor} | {verdict.model.value} | "
            f"{'accept' if verdict.accept else 'reject'} | "
            f"{'∞' if math.isinf(predicted) else f'{predicted * 1e3:.0f}'} | "
            f"{'; '.join(verdict.reasons) or '–'} |"
        )
    return "\n".join(lines)


def _e11_reading(rows: Sequence[RunRow]) -> str:
    text = _per_condition(
        rows,
        lambda s: (
            f"C={s['slots']} B={s['floor']} {s['capacity_action']}: miss "
            f"{s['miss'].fmt()}, attainment {_fmt3(s['attainment'])}"
        ),
    )
    fixed = {
        (s["slots"], s["floor"]): s for s in summarize(rows) if s["capacity_action"] == "alarm"
    }
    alarms = {
        (s["slots"], s["floor"]): sum(
            (r["capacity_alarms"] or 0) > 0
            for r in rows
            if (r["slots"], r["floor"], r["capacity_action"]) == (s["slots"], s["floor"], "alarm")
        )
        for s in fixed.values()
    }
    judged = []
    for floor, v in _e11_verdicts()[1]:
        runs = [
            f"C = {c} {'no late assured request' if s['a_late'] == 0 else 'late assured requests'}"
            f" (capacity alarm in {alarms[c, floor]} of {s['runs']} runs)"
            for (c, b), s in sorted(fixed.items(), reverse=True)
            if b == floor
        ]
        judged.append(
            f"B = {floor}: {v.model.value} {'accepts' if v.accept else 'rejects'}; at run time "
            + ", ".join(runs)
        )
    broke = [
        b
        for b, v in _e11_verdicts()[1]
        if v.accept and (1, b) in fixed and fixed[1, b]["a_late"] > 0
    ]
    return (
        f"{text} The screens before the run (configured C = {_E11_CONFIGURED_SLOTS}) against "
        f"what happened: {'; '.join(judged)}. "
        + (
            f"A screen accepted B = {', '.join(map(str, sorted(set(broke))))} and the capacity "
            "precondition then broke at run time: only the online monitor, which watches the "
            "completions, saw it."
            if broke
            else "No accepted configuration broke at run time here."
        )
    )


E11 = Experiment(
    "E11",
    "Capacity degradation: fixed vs lowered vs adaptive floor",
    "Healthy C = 4 vs a batch cap of C = 1 (the measured μ_sat cut is in the table below; "
    "published: ≈ 62 %); floors: fixed B = 6, lowered B = 4, adaptive (B = 6 with capacity action "
    "lower-floor: ⌊μ̂·W⌋ from busy windows); marquee load for 20 s, so 120 floor-assured "
    "requests per run (paced 6/s); doom gate off; reps 10. Both static screens (first-moment "
    "and makespan) run before the run on what the operator knows then: the configuration "
    "as configured, healthy C = 4 (docs/design.md §11); the capacity alarm's firings are counted.",
    _e11,
    reps=10,
    shown=("slots", "floor", "capacity_action"),
    extra=_e11_screen,
    reading=_e11_reading,
)
