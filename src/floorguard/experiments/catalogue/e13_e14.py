"""E13 (floor-entitled attainment and the phase sweep) and E14 (the envelope check per
cell)."""

from __future__ import annotations

from collections.abc import Sequence

from floorguard.experiments import figures
from floorguard.experiments.catalogue._common import _range
from floorguard.experiments.catalogue.e12 import E12_BASE_MS, _e12_grid
from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize
from floorguard.profiles import get_profile


def _e13(quick: bool) -> list[Condition]:
    marquee = [
        Condition(policy=p, learner="predictor-sheddable", beta=b)
        for b in (0.0, 2.0)
        for p in ("guard", "unguarded")
    ]
    deadline = round(1.5 * E12_BASE_MS["v100-moe"], 1)
    bursty = [
        c
        for c in _e12_grid()(False)
        if c.profile == "v100-moe"
        and c.deadline_ms == deadline
        and (c.policy == "unguarded" or c.excess == "reject")
    ]
    return marquee + (bursty[:4] if quick else bursty)


def _e13_reading(rows: Sequence[RunRow]) -> str:
    summaries = [s for s in summarize(rows) if s["attainment"] is not None]
    parts = []
    for workload in dict.fromkeys(s["workload"] for s in summaries):
        for policy in ("guard", "unguarded"):
            mine = [s for s in summaries if (s["workload"], s["policy"]) == (workload, policy)]
            if mine:
                parts.append(
                    f"{workload}/{policy}: attainment {_range(mine, 'attainment')}, "
                    f"worst phase {_range(mine, 'worst_phase')}"
                )
    guard = [r for r in rows if r["policy"] == "guard"]
    admitted = sum(r["entitled_admitted"] for r in guard)
    entitled = sum(r["entitled"] for r in guard)
    late = []
    for workload in dict.fromkeys(s["workload"] for s in summaries):
        mine = [s for s in summaries if (s["workload"], s["policy"]) == (workload, "guard")]
        worst = 1 - min(s["attainment"] or 0.0 for s in mine) if mine else 0.0
        inside = sum(bool(s["inside_region"]) for s in mine)
        late.append(
            f"{'none' if worst == 0 else f'up to {worst:.1%} of the entitled'} on the "
            f"{workload} ({inside} of {len(mine)} of its cells inside docs/design.md §6's "
            "region)"
        )
    cause = (
        "so what it loses there is lateness: " + "; ".join(late)
        if admitted == entitled
        else f"so it also refused {entitled - admitted} of them; lateness: " + "; ".join(late)
    )
    return (
        "; ".join(parts) + ". Attainment counts an entitled request only if it was "
        f"admitted *and* on time. At φ = 0 the guard admitted {admitted} of {entitled} "
        f"entitled requests (AF), {cause}. Shifting the contract's origin makes other "
        "requests entitled than those the guard's windows chose; the worst-phase drop is what "
        "the shared-epoch assumption carries."
    )


E13 = Experiment(
    "E13",
    "Floor-entitled attainment and the phase sweep",
    "E1's marquee (the `published` predictor) at β ∈ {0, 2} and E12's slices on v100-moe at "
    "factor 1.5 (d = 1230 ms, B = 3, guard/reject), guard vs unguarded. Attainment is "
    "recomputed with the contract's window origin shifted by φ = 0, 50, …, 950 ms; the "
    "guard's own windows stay at t0 = 0.",
    _e13,
    reps=10,
    shown=("workload", "policy", "beta", "slice_index"),
    figures=(figures.attainment_vs_phase,),
    reading=_e13_reading,
)

# -- E14–E16, E19 ---------------------------------------------------------------------------


def _e14(quick: bool) -> list[Condition]:
    floors = (2, 8, 12) if quick else (2, 4, 6, 8, 10, 12)
    return [
        Condition(floor=b, assured_rate=float(b), opp_rate=2.0, deadline_ms=d)
        for b in floors
        for d in ((1200,) if quick else (600, 1200, 2000))
    ]


def _e14_extra(rows: Sequence[RunRow]) -> str:
    """Per cell: max Q_A, max service vs s_max(16), ρ_a and the §6 bound (W = 1 s)."""
    lines = [
        "| B | d (ms) | max Q_A | max service (ms) | s_max(16) (ms) | ρ_a | §6 bound (ms) "
        "| services > s_max | region |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summarize(rows):
        s_max = get_profile(s["profile"]).ceiling.at(16)
        waves = -(-s["floor"] // s["slots"])
        above = sum(
            r["num_above_ceiling"]
            for r in rows
            if (r["floor"], r["deadline_ms"]) == (s["floor"], s["deadline_ms"])
        )
        lines.append(
            f"| {s['floor']} | {s['deadline_ms']:.0f} | {s['max_qa']} | "
            f"{s['max_service_ms']:.0f} | {s_max * 1e3:.0f} | "
            f"{s['floor'] * s_max / s['slots']:.2f} | {s_max * (1 + waves) * 1e3:.0f} | "
            f"{above} | {'inside' if s['inside_region'] else 'outside'} |"
        )
    return "\n".join(lines)


def _e14_reading(rows: Sequence[RunRow]) -> str:
    """Q_A against B, and the largest service against s_max: where services exceeded it,
    A3 fails in those cells whatever their load; where none did, A3 held everywhere."""
    cells = summarize(rows)
    above = [s for s in cells if any(
        r["num_above_ceiling"] for r in rows if (r["floor"], r["deadline_ms"]) ==
        (s["floor"], s["deadline_ms"]))]  # fmt: skip
    count = sum(r["num_above_ceiling"] for r in rows)
    a3 = (
        f"{count} services exceeded it, in {len(above)} cells, which puts those cells outside "
        "§6's region by A3 whatever their load"
        if count
        else "no service exceeded it, so A3 held in every cell: a cell outside §6's region "
        "is outside by its load or its deadline"
    )
    return (
        f"max Q_A stayed ≤ B in {sum(s['max_qa'] <= s['floor'] for s in cells)} of "
        f"{len(cells)} cells; the largest service seen was "
        f"{max(s['max_service_ms'] or 0 for s in cells):.0f} ms against s_max(16) = "
        f"{get_profile('v100-moe').ceiling.at(16) * 1e3:.0f} ms; {a3}."
    )


E14 = Experiment(
    "E14",
    "Envelope check per cell",
    "The E7 grid's rows (B ∈ {2, …, 12}, d ∈ {600, 1200, 2000} ms): max Q_A, max observed "
    "service against s_max, and whether each cell is inside §6's region; reps 3.",
    _e14,
    reps=3,
    shown=("floor", "deadline_ms"),
    extra=_e14_extra,
    reading=_e14_reading,
)
