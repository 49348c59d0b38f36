"""E17 and E18: both static screens evaluated on measured runs (docs/design.md §9, §11).

The screen *under evaluation* is the published kind, `first-moment`; floorguard's own
`makespan` screen is scored on the same cells beside it. Every table and figure shows both,
each fed ŝ by p50 and by p99 of the calibration runs' service samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from floorguard.analysis.plot import subplots
from floorguard.experiments.conditions import Condition, mu_sat_of
from floorguard.experiments.records import RunRow
from floorguard.screen.evaluate import (
    DEADLINES_S,
    Cell,
    Scores,
    cells_for,
    clustered_scores,
    held_out,
    score,
)
from floorguard.screen.model import ScreenModel
from floorguard.sim.probe import latency_model_for, probe_lengths

T = TypeVar("T")

__all__ = [
    "E17_KNEE",
    "E18_KNEE",
    "e17_grid",
    "e18_grid",
    "held_out_figure",
    "screen_extra",
    "screen_figure",
    "screen_reading",
]

SCREENS = tuple(m.value for m in ScreenModel)
HEADLINE = ("p50", "p99")
"""The aggregations every screen is shown with (docs/design.md §11: the published screen fed p50 or
p99 ŝ)."""
OUTCOME_AGGREGATIONS = ("max", "mean", "median")
"""The regime table's split (docs/design.md §11, E18): a cell's measured outcome aggregated over its
reps — its SLO met in every rep (the worst rep's p95 ≤ D), by the mean of the reps' p95, by
the median rep's — with ŝ fixed at `REGIME_SERVICE`, so each screen has one accept count
per regime for all three."""
REGIME_SERVICE = "p50"
HELD_OUT_AGGREGATION = "p99"
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
E17_KNEE = (1.0, 1.4)
"""E17's near-knee band: the published knee sits at ρ̂ ≈ 1.2."""
E18_KNEE = (0.9, 1.1)

_SCREEN = Condition(learner="predictor-sheddable", keep_samples=True)
"""The marquee guard (paced assured, the published `light` predictor as the surplus
learner, β = 1, d = 1820 ms as its SLO), doom gate off: nothing is dropped, so every
admitted assured sojourn is measured whole and re-thresholded afterwards."""

E17_FLOORS = (2, 4, 6, 8)
E17_RHO = (1.08, 1.25, 1.6, 2.5, 4.06)


def e17_grid(quick: bool) -> list[Condition]:
    """40 overload configurations: dispatch × B × offered ρ̂ ∈ [1.08, 4.06]; the
    opportunistic rate is what brings the offered load to ρ̂·μ_sat (measured μ_sat)."""
    floors = (2, 8) if quick else E17_FLOORS
    targets = (E17_RHO[0], E17_RHO[-1]) if quick else E17_RHO
    mu_sat = mu_sat_of(_SCREEN.profile, _SCREEN.slots)
    return [
        replace(
            _SCREEN,
            policy=p,
            floor=b,
            assured_rate=float(b),
            opp_rate=round(rho * mu_sat - b, 2),
        )
        for p in ("guard", "gated-fifo")
        for b in floors
        for rho in targets
    ]


def e18_grid(quick: bool) -> list[Condition]:
    """Sub-saturation: opportunistic {1, 2, 3}/s × C {4, 6, 8} × dispatch, B = 6."""
    slots = (4, 8) if quick else (4, 6, 8)
    loads = (1.0, 3.0) if quick else (1.0, 2.0, 3.0)
    return [
        replace(_SCREEN, policy=p, slots=c, opp_rate=o)
        for p in ("guard", "gated-fifo")
        for c in slots
        for o in loads
    ]


def _label(row: RunRow) -> str:
    dispatch = "fifo" if row["policy"] == "gated-fifo" else "priority"
    return f"{dispatch} B={row['floor']} C={row['slots']} λo={row['opp_rate']:g}"


def _by_config(rows: Sequence[RunRow]) -> dict[str, list[RunRow]]:
    out: dict[str, list[RunRow]] = {}
    for row in sorted(rows, key=lambda r: r["rep"]):
        out.setdefault(_label(row), []).append(row)
    return out


_MEMO: dict[tuple[str, int, str], tuple[Sequence[RunRow], object]] = {}


def _memo(what: str, rows: Sequence[RunRow], how: str, compute: Callable[[], T]) -> T:
    """`compute()` once per row set (the extra, the reading and the figures all read the
    same cells): keyed by the rows object itself, checked by identity."""
    key = (what, id(rows), how)
    hit = _MEMO.get(key)
    if hit is None or hit[0] is not rows:
        if len(_MEMO) > 64:
            _MEMO.clear()
        hit = (rows, compute())
        _MEMO[key] = hit
    return hit[1]  # type: ignore[return-value]


def _cells(rows: Sequence[RunRow], aggregation: str) -> tuple[Cell, ...]:
    """In-sample cells: ŝ and the outcome from all of a configuration's runs."""
    return _memo(
        "cells",
        rows,
        aggregation,
        lambda: tuple(
            c
            for name, runs in _by_config(rows).items()
            for c in cells_for(name, runs, runs, aggregation)
        ),
    )


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


@dataclass(frozen=True)
class _Folds:
    block: int
    reps: int
    per_screen: dict[str, list[Scores]]

    @property
    def fraction(self) -> float:
        return self.block / self.reps


def _held_out(rows: Sequence[RunRow]) -> list[_Folds]:
    return _memo("held-out", rows, HELD_OUT_AGGREGATION, lambda: _compute_held_out(rows))


def _compute_held_out(rows: Sequence[RunRow]) -> list[_Folds]:
    by_config = _by_config(rows)
    out: list[_Folds] = []
    for fraction in FRACTIONS:
        block, folds = held_out(by_config, fraction, HELD_OUT_AGGREGATION)
        if out and out[-1].block == block:
            continue
        out.append(_Folds(block, len(folds), {s: [score(f, s) for f in folds] for s in SCREENS}))
    return out


def _scores_table(rows: Sequence[RunRow]) -> list[str]:
    lines = [
        "| screen | ŝ | cells | accepts | precision | recall | agreement | coverage |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for verdict in (*SCREENS, "service-only", "always-reject"):
        for how in HEADLINE if verdict != "always-reject" else HEADLINE[:1]:
            cells = _cells(rows, how)
            s = score(cells, verdict)
            ci = clustered_scores(cells, verdict, num_resamples=500)
            lines.append(
                f"| {verdict} | {how if verdict != 'always-reject' else '–'} | {s.n} | "
                f"{s.accepts} | {ci['precision'].fmt()} | {ci['recall'].fmt()} | "
                f"{ci['agreement'].fmt()} | {ci['coverage'].fmt()} |"
            )
    return lines


def _by_dispatch(cells: Sequence[Cell]) -> dict[str, list[Cell]]:
    out: dict[str, list[Cell]] = {}
    for c in cells:
        out.setdefault(c.dispatch, []).append(c)
    return out


def _dispatch_table(rows: Sequence[RunRow]) -> list[str]:
    """Per dispatch order (ŝ p50): the load the stack in front admitted as the screens see
    it, and each screen's scores and unbounded predictions."""
    head = " | ".join(f"{s} accepts | precision | recall | unbounded" for s in SCREENS)
    lines = [
        f"| dispatch | configurations | admitted load | cells | met | {head} |",
        "|---|---|---|---|---|" + "---|---|---|---|" * len(SCREENS),
    ]
    for dispatch, group in _by_dispatch(_cells(rows, HEADLINE[0])).items():
        loads = [c.admitted_load for c in group]
        parts = []
        for verdict in SCREENS:
            s = score(group, verdict)
            unbounded = len({c.config for c in group if math.isinf(c.predicted_s[verdict])})
            parts.append(f"{s.accepts} | {_fmt(s.precision)} | {_fmt(s.recall)} | {unbounded}")
        lines.append(
            f"| {dispatch} | {len({c.config for c in group})} | {min(loads):.2f}–{max(loads):.2f}"
            f" | {len(group)} | {sum(c.met for c in group)} | {' | '.join(parts)} |"
        )
    return lines


def _dispatch_reading(rows: Sequence[RunRow]) -> str:
    """Where each dispatch order's first-moment errors fall, from the model: a configuration
    whose admitted load is past capacity has no steady state, so the screen's mean wait is
    unbounded; a finite run can still meet its loose deadlines."""
    screen = ScreenModel.FIRST_MOMENT.value
    slo = max((r["deadline_ms"] for r in rows), default=0.0)
    parts = []
    for dispatch, group in _by_dispatch(_cells(rows, HEADLINE[0])).items():
        configs = {c.config: c for c in group}
        competing = [c.competing_load for c in configs.values()]
        unbounded = [c for c in configs.values() if math.isinf(c.predicted_s[screen])]
        met_rejected = [c for c in group if c.met and math.isinf(c.predicted_s[screen])]
        text = (
            f"{dispatch}: the stack in front admitted a load of "
            f"{min(c.admitted_load for c in group):.2f}–{max(c.admitted_load for c in group):.2f}"
            f" of capacity (p50 ŝ); the part of it that competes with an assured request "
            f"({'all of it' if dispatch == 'fifo' else 'the assured load alone'}) is "
            f"{min(competing):.2f}–{max(competing):.2f}, past 1 in {len(unbounded)} of "
            f"{len(configs)} configurations, where the first-moment screen predicts an "
            f"unbounded wait; recall {_fmt(score(group, screen).recall)}"
        )
        if met_rejected:
            p95 = [c.measured_p95_s * 1e3 for c in met_rejected]
            text += (
                f"; {len(met_rejected)} of those configurations' cells were met nonetheless, "
                f"each at a deadline past its measured p95 ({min(p95):.0f}–{max(p95):.0f} ms, "
                f"{min(p95) / slo:.2f}–{max(p95) / slo:.2f}× the learner's SLO)"
            )
            if dispatch == "fifo":
                text += (
                    ": the learner admits by the queue it sees and stops admitting the "
                    "surplus where its prediction passes its SLO, so the FIFO queue it lets "
                    "build stays bounded near that SLO whatever the admitted mean; the "
                    "first-moment formula takes the admitted rate as independent of the "
                    "queue, has no steady state past 1, and cannot see that bound — these "
                    "are its false rejects"
                )
        parts.append(text)
    return "By dispatch — " + "; ".join(parts) + "."


def _regimes(cells: Sequence[Cell], knee: tuple[float, float]) -> dict[str, list[Cell]]:
    lo, hi = knee
    groups = {
        "ρ̂ < 1": [c for c in cells if c.rho_hat < 1],
        "ρ̂ ≥ 1": [c for c in cells if c.rho_hat >= 1],
        f"near knee ({lo:g} ≤ ρ̂ ≤ {hi:g})": [c for c in cells if lo <= c.rho_hat <= hi],
        f"beyond the knee (ρ̂ > {hi:g})": [c for c in cells if c.rho_hat > hi],
    }
    return {name: group for name, group in groups.items() if group}


def _outcome_cells(rows: Sequence[RunRow], how: str) -> tuple[Cell, ...]:
    """The in-sample cells (ŝ = `REGIME_SERVICE`) with `met` decided by the reps' measured
    outcomes aggregated by `how` (`OUTCOME_AGGREGATIONS`) instead of the pooled p95."""
    picks: dict[str, Callable[[list[float]], Any]] = {
        "max": np.max,
        "mean": np.mean,
        "median": np.median,
    }
    pick = picks[how]

    def compute() -> tuple[Cell, ...]:
        p95 = {
            name: [
                float(np.percentile(r["a_sojourns"], 95)) if r["a_sojourns"] else math.inf
                for r in runs
            ]
            for name, runs in _by_config(rows).items()
        }
        return tuple(
            replace(c, met=float(pick(p95[c.config])) <= c.deadline_s)
            for c in _cells(rows, REGIME_SERVICE)
        )

    return _memo("outcome", rows, how, compute)


def _regime_table(rows: Sequence[RunRow], knee: tuple[float, float]) -> list[str]:
    head = " | ".join(f"{s} accepts | precision | recall" for s in SCREENS)
    lines = [
        f"| regime | outcome over reps | cells | met | {head} |",
        "|---|---|---|---|" + "---|---|---|" * len(SCREENS),
    ]
    for how in OUTCOME_AGGREGATIONS:
        for regime, group in _regimes(_outcome_cells(rows, how), knee).items():
            parts = []
            for verdict in SCREENS:
                s = score(group, verdict)
                parts.append(f"{s.accepts} | {_fmt(s.precision)} | {_fmt(s.recall)}")
            met = sum(c.met for c in group)
            lines.append(f"| {regime} | {how} | {len(group)} | {met} | {' | '.join(parts)} |")
    return lines


def _false_accepts(cells_by: Mapping[str, Sequence[Cell]]) -> dict[tuple[str, str], list[Cell]]:
    """(screen, aggregation) → its false accepts."""
    return {
        (verdict, how): [c for c in cells if c.accepts[verdict] and not c.met]
        for how, cells in cells_by.items()
        for verdict in SCREENS
    }


def _rho_bins(cells: Sequence[Cell]) -> list[tuple[float, float]]:
    edges = [0.0, 0.5, 0.8, 1.0, 1.2, 1.4, 2.0, 3.0, math.inf]
    present = sorted({c.rho_hat for c in cells})
    return [(lo, hi) for lo, hi in itertools.pairwise(edges) if any(lo <= r < hi for r in present)]


def _false_accept_tables(rows: Sequence[RunRow]) -> list[str]:
    cells_by = {how: _cells(rows, how) for how in HEADLINE}
    bad = _false_accepts(cells_by)
    keys = list(bad)
    names = " | ".join(f"{v} {h}" for v, h in keys)
    if not any(bad.values()):
        return ["No screen made a false accept with p50 or p99 ŝ."]
    cells = cells_by[HEADLINE[0]]
    lines = [
        "By offered ρ̂ (false accepts / cells in the bin):",
        "",
        f"| ρ̂ bin | cells | {names} |",
        "|---|---|" + "---|" * len(keys),
    ]
    for lo, hi in _rho_bins(cells):
        n = sum(lo <= c.rho_hat < hi for c in cells)
        counts = " | ".join(str(sum(lo <= c.rho_hat < hi for c in bad[k])) for k in keys)
        lines.append(f"| [{lo:g}, {hi:g}) | {n} | {counts} |")
    lines += [
        "",
        "By configuration (only those with a false accept; count of its 33 cells):",
        "",
        f"| configuration | ρ̂ | ŝ p50 / p99 (ms) | measured p95 (ms) | {names} |",
        "|---|---|---|---|" + "---|" * len(keys),
    ]
    p99 = {c.config: c for c in cells_by["p99"]}
    for config in dict.fromkeys(c.config for group in bad.values() for c in group):
        c = next(c for c in cells if c.config == config)
        counts = " | ".join(str(sum(g.config == config for g in bad[k])) for k in keys)
        lines.append(
            f"| {config} | {c.rho_hat:.2f} | {c.service_s * 1e3:.0f} / "
            f"{p99[config].service_s * 1e3:.0f} | {c.measured_p95_s * 1e3:.0f} | {counts} |"
        )
    return lines


def _held_out_table(rows: Sequence[RunRow]) -> list[str]:
    lines = [
        "| calibration fraction (block / reps) | folds | screen | precision, fold mean "
        "[min, max] | recall, mean | coverage, mean |",
        "|---|---|---|---|---|---|",
    ]
    for f in _held_out(rows):
        for verdict, folds in f.per_screen.items():
            p = [s.precision for s in folds if s.precision is not None]
            r = [s.recall for s in folds if s.recall is not None]
            cov = [s.coverage for s in folds if s.coverage is not None]
            precision = f"{np.mean(p):.3f} [{min(p):.3f}, {max(p):.3f}]" if p else "– (no accepts)"
            lines.append(
                f"| {f.fraction:.2f} ({f.block}/{f.reps}) | {len(folds)} | {verdict} | "
                f"{precision} | "
                f"{_fmt(float(np.mean(r)) if r else None)} | "
                f"{_fmt(float(np.mean(cov)) if cov else None)} |"
            )
    return lines


def _load_facts(rows: Sequence[RunRow]) -> str:
    """What the published learner let through, and the backend's measured μ_sat per C: the
    two things that set where the grid's cells sit."""
    offered = sum(r["o_offered"] for r in rows)
    admitted = sum(r["o_admitted"] for r in rows)
    mu = {r["slots"]: r["mu_sat"] for r in rows}
    profile = rows[0]["profile"]
    first = rows[0]
    lengths = probe_lengths(first["tokens"], first["long_tokens"], first["long_fraction"])
    fits = {c: latency_model_for(profile, c, first["predictor"], lengths) for c in sorted(mu)}
    return (
        f"The published learner admitted {admitted} of {offered} opportunistic requests "
        f"({admitted / offered:.1%}); its fits ({rows[0]['predictor']}, per C: samples, R², "
        "seconds per queued request): "
        + ", ".join(
            f"C = {c} {m.num_samples}, {m.r2:.3f}, {m.coefficients[2]:.3f}" for c, m in fits.items()
        )
        + ". Measured μ_sat: "
        + ", ".join(f"C = {c} {m:.2f}/s" for c, m in sorted(mu.items()))
        + "."
    )


def screen_extra(rows: Sequence[RunRow], knee: tuple[float, float]) -> str:
    cells = _cells(rows, HEADLINE[0])
    return "\n".join(
        [
            f"Both screens on {len({c.config for c in cells})} configurations × "
            f"{len(DEADLINES_S)} deadlines (300–3500 ms) = {len(cells)} cells. Each is fed ŝ "
            "(an aggregation of the calibration runs' service samples) and the opportunistic "
            "rate those runs admitted; the outcome of a cell is the measured p95 of admitted "
            "assured sojourn ≤ D. In-sample below (calibration = test = all of a "
            "configuration's runs); held out at the end. Intervals: 95 % bootstrap over "
            f"whole configurations. Offered ρ̂ {min(c.rho_hat for c in cells):.2f}–"
            f"{max(c.rho_hat for c in cells):.2f}. {_load_facts(rows)}",
            "",
            *_scores_table(rows),
            "",
            f"By regime × aggregation of the measured outcome over a cell's reps (design §11: "
            f"met in every rep / by the reps' mean p95 / in the median rep; ŝ fixed at "
            f"{REGIME_SERVICE}, so each screen's accepts are the same for all three; `met` = "
            "cells whose SLO held by that aggregation):",
            "",
            *_regime_table(rows, knee),
            "",
            "By the dispatch order behind the admission (ŝ p50; `admitted load` = (admitted "
            "assured + admitted opportunistic rate)·ŝ/C as the screens see it; `unbounded` = "
            "configurations the screen predicts an unbounded sojourn for):",
            "",
            *_dispatch_table(rows),
            "",
            "Where the false accepts sit.",
            "",
            *_false_accept_tables(rows),
            "",
            f"Held-out calibration: ŝ = the {HELD_OUT_AGGREGATION} of a rotating block of "
            "runs, the outcome from the configuration's other runs (rotated k-fold, one fold "
            "per rep, run-level disjoint).",
            "",
            *_held_out_table(rows),
        ]
    )


def _summary(cells: Sequence[Cell], verdict: str) -> str:
    s = score(cells, verdict)
    return f"{s.accepts}/{s.n} accepted, precision {_fmt(s.precision)}, recall {_fmt(s.recall)}"


def screen_reading(rows: Sequence[RunRow], knee: tuple[float, float]) -> str:
    p50, p99 = _cells(rows, "p50"), _cells(rows, "p99")
    parts = []
    for verdict in SCREENS:
        a, b = score(p50, verdict), score(p99, verdict)
        buys = (
            f"p99 over p50 moves precision {_fmt(a.precision)} → {_fmt(b.precision)} and "
            f"recall {_fmt(a.recall)} → {_fmt(b.recall)}"
        )
        bad = sorted(
            {(c.config, round(c.rho_hat, 2)) for c in p50 if c.accepts[verdict] and not c.met},
            key=lambda t: t[1],
        )
        where = (
            "no false accept at p50"
            if not bad
            else f"its p50 false accepts sit in {len(bad)} configuration(s) at ρ̂ "
            f"{bad[0][1]:.2f}–{bad[-1][1]:.2f}"
        )
        parts.append(f"{verdict}: p50 {_summary(p50, verdict)}; {where}; {buys}")
    lo, hi = knee
    near = [c for c in p50 if lo <= c.rho_hat <= hi]
    knee_text = "; ".join(
        f"{v} {_fmt(score(near, v).precision)} ({score(near, v).accepts} accepts)" for v in SCREENS
    )
    folds = _held_out(rows)
    held = []
    for f in (folds[0], folds[-1]) if folds else ():
        for verdict, scores in f.per_screen.items():
            p = [s.precision for s in scores if s.precision is not None]
            cov = np.mean([s.coverage or 0.0 for s in scores])
            held.append(
                f"{verdict} at {f.block} run(s) {np.mean(p):.3f} (coverage {cov:.3f})"
                if p
                else f"{verdict} at {f.block} run(s): no accepts"
            )
    service = score(p50, "service-only")
    above = [c for c in p50 if c.rho_hat >= 1]
    mu = {r["slots"]: r["mu_sat"] for r in rows}
    saturation = (
        f" {len({c.config for c in above})} of {len({c.config for c in p50})} configurations "
        "sit at ρ̂ ≥ 1 because μ_sat does not grow with C in the fitted model: its "
        "sustained-load coupling, fitted at C = 4 only (every published node figure "
        "is batch-4), stalls every decoding sequence for each joiner's prefill, so a wider "
        f"batch is no faster. The published grid's wider-C cells were sub-saturated; here "
        f"{len(above)} of {len(p50)} cells are at ρ̂ ≥ 1."
        if len(mu) > 1 and above and mu[max(mu)] <= mu[min(mu)]
        else ""
    )
    return (
        ". ".join(parts)
        + f". Near the knee ({lo:g} ≤ ρ̂ ≤ {hi:g}, p50 ŝ): precision {knee_text or '–'}. "
        f"Baselines: service-only at p50 {_summary(p50, 'service-only')} "
        f"(agreement {_fmt(service.agreement)}); always-reject has recall 0. Held out with "
        f"{HELD_OUT_AGGREGATION} ŝ: {'; '.join(held)}. {_dispatch_reading(rows)} "
        f"{_load_facts(rows)}{saturation} "
        "The first-moment screen predicts a typical sojourn, so its accepts are only as good "
        "as the margin between the mean and the measured p95 (the service tail: its false "
        "accepts sit where D is within the dispersion above ŝ); the makespan screen bounds a "
        "whole window's work and refuses what it cannot bound."
    )


_STYLE = {
    ("first-moment", "p50"): ("tab:red", "o"),
    ("first-moment", "p99"): ("tab:orange", "^"),
    ("makespan", "p50"): ("tab:blue", "s"),
    ("makespan", "p99"): ("tab:cyan", "D"),
}


def screen_figure(rows: Sequence[RunRow], out: Path, knee: tuple[float, float]) -> Path:
    """Per configuration, each screen's predicted sojourn over the measured p95 against ρ̂
    (below 1: optimistic, where false accepts come from), and each screen's precision and
    coverage by aggregation."""
    fig, axes = subplots(1, 2, figsize=(12, 4.6))
    ceiling = 30.0
    for (verdict, how), (color, marker) in _STYLE.items():
        by: dict[str, Cell] = {c.config: c for c in _cells(rows, how)}
        rho = [c.rho_hat for c in by.values()]
        ratio = [
            min(c.predicted_s[verdict] / c.measured_p95_s, ceiling)
            if math.isfinite(c.predicted_s[verdict])
            else ceiling
            for c in by.values()
        ]
        axes[0].scatter(
            rho, ratio, s=24, color=color, marker=marker, alpha=0.8, label=f"{verdict}, {how} ŝ"
        )
    axes[0].axhline(1.0, color="k", lw=1)
    axes[0].axvspan(*knee, color="gray", alpha=0.15, label="near-knee band")
    axes[0].set(
        yscale="log",
        xlabel="offered ρ̂",
        ylabel=f"predicted / measured p95 (top = unbounded, clipped at {ceiling:g})",
        title="Below 1: the screen is optimistic",
    )
    axes[0].legend(fontsize=7, loc="lower right")
    labels, precision, coverage = [], [], []
    for verdict, how in _STYLE:
        s = score(_cells(rows, how), verdict)
        labels.append(f"{verdict}\n{how}")
        precision.append(s.precision if s.precision is not None else 0.0)
        coverage.append(s.coverage or 0.0)
    x = np.arange(len(labels))
    bars = axes[1].bar(x - 0.2, precision, 0.4, label="precision of accept")
    cov = axes[1].bar(x + 0.2, coverage, 0.4, label="coverage (share accepted)")
    for group in (bars, cov):
        axes[1].bar_label(group, fmt="%.2f", fontsize=7)
    axes[1].set_xticks(x, labels, fontsize=8)
    axes[1].set(ylim=(0, 1.3), ylabel="fraction of cells", title="In-sample, all cells")
    axes[1].legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    path = out / f"{out.name.lower()}_screen_predicted_vs_measured.png"
    fig.savefig(path, dpi=110)
    return path


def held_out_figure(rows: Sequence[RunRow], out: Path) -> Path:
    """Held-out precision (fold mean, min–max) and coverage against the calibration
    fraction, both screens, p99 ŝ."""
    fig, axes = subplots(1, 2, figsize=(11, 4.0))
    folds = _held_out(rows)
    for verdict, color in zip(SCREENS, ("tab:red", "tab:blue"), strict=True):
        xs, mean, low, high, cover = [], [], [], [], []
        for f in folds:
            p = [s.precision for s in f.per_screen[verdict] if s.precision is not None]
            cover.append(float(np.mean([s.coverage or 0.0 for s in f.per_screen[verdict]])))
            if p:
                xs.append(f.fraction)
                mean.append(float(np.mean(p)))
                low.append(mean[-1] - min(p))
                high.append(max(p) - mean[-1])
        axes[0].errorbar(
            xs, mean, yerr=[low, high], marker="o", capsize=4, color=color, label=verdict
        )
        axes[1].plot([f.fraction for f in folds], cover, marker="o", color=color, label=verdict)
    axes[0].set(
        xlabel="calibration fraction (runs in the block / reps)",
        ylabel=f"precision of accept ({HELD_OUT_AGGREGATION} ŝ; fold mean, min–max)",
        ylim=(0, 1.05),
    )
    axes[1].set(
        xlabel="calibration fraction (runs in the block / reps)",
        ylabel="coverage (share of cells accepted)",
        ylim=(0, 1.05),
    )
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{out.name.lower()}_screen_precision_vs_calibration.png"
    fig.savefig(path, dpi=110)
    return path
