"""Shared by the catalogue's modules: number formats, per-condition and per-policy
sentences, the marquee defaults, and where the real traces are."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow, Summary
from floorguard.experiments.tables import summarize
from floorguard.sim.probe import PREDICTOR_FITS, latency_model_for, probe_lengths


def data_dir() -> Path:
    """Where the real Azure traces are: `$FLOORGUARD_DATA/azure-llm-2023`, else the
    `shared/data` folder beside a source checkout (the repository's parent). E12 runs the
    traces it finds there and the synthetic source always."""
    root = os.environ.get("FLOORGUARD_DATA")
    if root:
        return Path(root) / "azure-llm-2023"
    return Path(__file__).resolve().parents[5] / "shared" / "data" / "azure-llm-2023"


M = Condition()  # the marquee defaults


def _fmt3(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _range(summaries: Sequence[Mapping[str, Any]], key: str = "miss") -> str:
    values = [s[key].estimate if hasattr(s[key], "estimate") else s[key] for s in summaries]
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    return (
        f"{min(values):.3f}"
        if min(values) == max(values)
        else (f"{min(values):.3f}–{max(values):.3f}")
    )


def _per_condition(
    rows: Sequence[RunRow], describe: Callable[[Summary], str], conclusion: str = ""
) -> str:
    """ "Per condition: a; b; c." from one description per condition summary."""
    return (
        "Per condition: "
        + "; ".join(describe(s) for s in summarize(rows))
        + "."
        + (f" {conclusion}" if conclusion else "")
    )


def _by_policy(rows: Sequence[RunRow], what: str) -> str:
    summaries = summarize(rows)
    parts = []
    for policy in dict.fromkeys(s["policy"] for s in summaries):
        mine = [s for s in summaries if s["policy"] == policy]
        held = sum((s["held"].estimate or 0.0) * s["runs"] for s in mine)
        runs = sum(s["runs"] for s in mine)
        parts.append(
            f"**{policy}**: assured miss {_range(mine)} across {len(mine)} "
            f"condition(s), {held:.0f}/{runs} runs with no late assured request, "
            f"floor attainment {_range(mine, 'attainment')}"
        )
        if policy == "guard":
            parts[-1] += f", max Q_A {max(s['max_qa'] for s in mine)}"
    return f"{what} " + "; ".join(parts) + "."


def _sweep(
    rows: Sequence[RunRow], field: Literal["deadline_ms", "floor", "slots", "tokens"], label: str
) -> str:
    summaries = summarize(rows)
    several = len({x["profile"] for x in summaries}) > 1
    floors = field != "floor" and len({x["floor"] for x in summaries}) > 1

    def where(s: Summary) -> str:
        tags = [s["profile"]] if several else []
        tags += [f"B = {s['floor']}"] if floors else []
        return f" ({', '.join(tags)})" if tags else ""

    cells = ", ".join(
        f"{label} {s[field]:g}{where(s)}: "
        f"miss {s['miss'].fmt()} "
        f"{'inside' if s['inside_region'] else 'outside'}"
        for s in summaries
    )
    first_bad = next((s for s in summaries if s["a_late"] > 0), None)
    end = (
        f"The first condition with a late assured request is {label} {first_bad[field]:g}"
        f"{where(first_bad) or ' (' + first_bad['profile'] + ')'}."
        if first_bad
        else "No condition had a late assured request."
    )
    return f"Per condition (assured miss, request-level Wilson; §6 region): {cells}. {end}"


# -- E1–E3: the learner and the dispatch ----------------------------------------------------


def _beta_grid(learner: str) -> Callable[[bool], list[Condition]]:
    def grid(quick: bool) -> list[Condition]:
        betas = (0.0, 1.0) if quick else (0.0, 0.5, 1.0, 2.0)
        return [
            Condition(policy=p, learner=learner, beta=b, predictor=f, detail=True)
            for f in PREDICTOR_FITS
            for b in betas
            for p in ("guard", "unguarded")
        ]

    return grid


def _pooled_share(runs: Sequence[RunRow], cls: Literal["a", "o"]) -> str:
    """ "admitted/offered (share)" of class `cls` (`a` or `o`), pooled over `runs`."""
    if cls == "a":
        admitted, offered = sum(r["a_admitted"] for r in runs), sum(r["a_offered"] for r in runs)
    else:
        admitted, offered = sum(r["o_admitted"] for r in runs), sum(r["o_offered"] for r in runs)
    return f"{admitted}/{offered} ({admitted / offered:.0%})" if offered else "–"


def _admitted_by_beta(rows: Sequence[RunRow], assured: bool) -> str:
    """Per β, what the learner let through: the opportunistic share under each stack and,
    for a learner that may reject any class, the assured share unguarded (where nothing
    stops it)."""
    cells = []
    for beta in dict.fromkeys(r["beta"] for r in rows):
        mine = [r for r in rows if r["beta"] == beta]
        by = {
            p: [r for r in mine if r["policy"] == p]
            for p in dict.fromkeys(r["policy"] for r in mine)
        }
        parts = [f"O admitted {_pooled_share(runs, 'o')} {p}" for p, runs in by.items()]
        if assured and "unguarded" in by:
            parts.append(f"A admitted {_pooled_share(by['unguarded'], 'a')} unguarded")
        cells.append(f"β {beta:g}: " + ", ".join(parts))
    return "; ".join(cells)


def _by_predictor(rows: Sequence[RunRow], what: str, assured: bool = False) -> str:
    parts = []
    for fit in dict.fromkeys(r["predictor"] for r in rows):
        mine = [r for r in rows if r["predictor"] == fit]
        first = mine[0]
        lengths = probe_lengths(first["tokens"], first["long_tokens"], first["long_fraction"])
        model = latency_model_for(first["profile"], first["slots"], fit, lengths)
        parts.append(
            f"*{fit} predictor* ({model.num_samples} samples, R² {model.r2:.3f}, "
            f"{model.coefficients[2] * 1e3:.0f} ms per queued request{_queued_cost(mine)}) — "
            + _by_policy(mine, what)
            + " What it admitted, pooled over the runs: "
            + _admitted_by_beta(mine, assured)
            + "."
        )
    return " ".join(parts)


def _queued_cost(rows: Sequence[RunRow]) -> str:
    """What a queued request costs the ones behind it in these runs: the opportunistic
    requests' mean service over C (each holds one of C slots for one service), pooled."""
    services = [s for r in rows if (s := r.get("o_service_mean_s")) is not None]
    if not services:
        return ""
    cost_ms = float(np.mean(services)) / rows[0]["slots"] * 1e3
    return f", against {cost_ms:.0f} ms measured: the served requests' mean service / C"


def _against_published_29(rows: Sequence[RunRow]) -> str:
    """docs/design.md §11's one figure for the published learner: class-agnostic at β = 1 on the
    marquee it admitted 29 of 72 assured requests."""
    runs = [
        r
        for r in rows
        if r["predictor"] == "published" and r["beta"] == 1.0 and r["policy"] == "unguarded"
    ]
    if not runs:
        return ""
    per_run = np.mean([r["a_admitted"] for r in runs])
    offered = np.mean([r["a_offered"] for r in runs])
    return (
        f" Against the published figure (class-agnostic, β = 1, the marquee: 29 of 72 assured "
        f"admitted), the `published` fit admits {per_run:.1f} of {offered:.0f} per run "
        "unguarded."
    )
