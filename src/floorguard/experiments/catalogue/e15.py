"""E15: the doom gate — its firings and its false drops."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from floorguard.experiments.conditions import Condition, mu_sat_of
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize
from floorguard.profiles import get_profile

_E15_CELLS = tuple((b, d) for b in (6, 10, 14) for d in (1820, 1200, 800, 600, 400))
"""15 overload / tight-deadline guard cells: the flood over floors up to past capacity."""
PUBLISHED_L_MS = 236.0


def _e15(quick: bool) -> list[Condition]:
    cells = ((6, 1820), (14, 400)) if quick else _E15_CELLS
    return [
        Condition(
            learner="predictor-sheddable",
            floor=b,
            assured_rate=float(b),
            deadline_ms=d,
            doom_gate=gate,
            gate_lower_ms=PUBLISHED_L_MS if gate else 0.0,
            keep_ids=True,
        )
        for b, d in cells
        for gate in (True, False)
    ]


def _replayed_false_drops(rows: Sequence[RunRow], row: RunRow) -> int:
    """Of a gate-on run's doomed drops, those whose request completed on time in the same
    seed's gate-off run (the counterfactual replay: the request dispatched instead)."""
    if not row["doom_gate"]:
        return 0
    key = (row["floor"], row["deadline_ms"], row["seed"])
    off = next(
        r for r in rows if not r["doom_gate"] and (r["floor"], r["deadline_ms"], r["seed"]) == key
    )
    return len(set(row["doomed_ids"]) & set(off["on_time_ids"]))


def _e15_cell(rows: Sequence[RunRow], s: Mapping[str, Any]) -> list[RunRow]:
    key = (s["floor"], s["deadline_ms"], s["doom_gate"])
    return [r for r in rows if (r["floor"], r["deadline_ms"], r["doom_gate"]) == key]


def _on_time(runs: Sequence[RunRow]) -> int:
    return sum(round((r["goodput_per_s"] or 0) * r["span_s"]) for r in runs)


def _e15_extra(rows: Sequence[RunRow]) -> str:
    lines = [
        "| B | d (ms) | gate | DR firings (assured) | false drops by replay | "
        "drops with t + L_model(ℓ) ≤ D | on-time completions (all classes) | assured miss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summarize(rows):
        runs = _e15_cell(rows, s)
        assured = sum(r["dr_firings_assured"] for r in runs)
        lines.append(
            f"| {s['floor']} | {s['deadline_ms']:.0f} | "
            f"{'on' if s['doom_gate'] else 'off'} | {s['dr_firings']} ({assured}) | "
            f"{sum(_replayed_false_drops(rows, r) for r in runs)} | "
            f"{sum(r['false_drops'] for r in runs)} | {_on_time(runs)} | {s['miss'].fmt()} |"
        )
    return "\n".join(lines)


def _constant_against_model() -> str:
    """Whether the published constant can drop a request the model could still serve."""
    model_ms = get_profile("v100-moe").lower.at(16) * 1e3
    if model_ms >= PUBLISHED_L_MS:
        return (
            f"this model's minimum at ℓ = 16 is {model_ms:.0f} ms, above it, so on this model "
            "the constant never drops a 16-token request that could make it"
        )
    return f"this model's minimum at ℓ = 16 is {model_ms:.0f} ms, below it"


def _e15_reading(rows: Sequence[RunRow]) -> str:
    on = [s for s in summarize(rows) if s["doom_gate"]]
    fired = [s for s in on if s["dr_firings"] > 0]
    on_rows = [r for r in rows if r["doom_gate"]]
    firings = sum(r["dr_firings"] for r in on_rows)
    assured = sum(r["dr_firings_assured"] for r in on_rows)
    replayed = sum(_replayed_false_drops(rows, r) for r in on_rows)
    false = sum(r["false_drops"] for r in rows)
    better = sum(
        _on_time(_e15_cell(rows, s)) > _on_time(_e15_cell(rows, {**s, "doom_gate": False}))
        for s in on
    )
    quiet = ", ".join(
        f"B {s['floor']} d {s['deadline_ms']:.0f}" for s in on if s["dr_firings"] == 0
    )
    return (
        f"With the published constant L = {PUBLISHED_L_MS:.0f} ms the gate fired in "
        f"{len(fired)} of {len(on)} cells ({f'silent in {quiet}' if quiet else 'none silent'}), "
        f"{firings} firings in all ({assured} assured, {firings - assured} opportunistic). By "
        f"counterfactual replay (the same seed with the gate off) {replayed} of them were "
        "false drops: requests that then completed on time. Against the model's own minimum, "
        f"{false} drops could still have made it ({_constant_against_model()})"
        + (
            ": so the replay's on-time completions of dropped requests come from the replay "
            "itself, not from an unsound drop — with the gate off the learner sees other loads "
            "and admits other surplus, and the dropped request meets another queue"
            if replayed and not false
            else ""
        )
        + f". With the gate "
        f"on, on-time completions were higher than with it off in {better} of {len(on)} "
        "cells: a doomed request that is not dropped still takes a slot from one that could "
        f"finish. Why it is not near-inert here: {_e15_where(on_rows)}."
    )


def _causes(on_rows: Sequence[RunRow], pick: Callable[[RunRow], bool]) -> Counter[str]:
    out: Counter[str] = Counter()
    for r in on_rows:
        if pick(r):
            out.update(r["doomed_causes"])
    return out


def _e15_where(on_rows: Sequence[RunRow]) -> str:
    """Every firing accounted for: by the cell it fired in (the assured stream alone past
    the backend's capacity, a deadline inside the service range, or neither) and by what
    kept the dropped request waiting (`doomed_causes`)."""
    mu_sat = mu_sat_of("v100-moe", 4)
    service_max_ms = max(r["max_service_s"] for r in on_rows) * 1e3
    groups = (
        (
            f"in cells whose assured stream alone is past the measured μ_sat ({mu_sat:.2f}/s), "
            "where the floor admits B whatever the queue and the assured queue grows without "
            "bound",
            lambda r: r["assured_rate"] > mu_sat,
        ),
        (
            f"in cells within capacity whose d is inside the service range (≤ "
            f"{service_max_ms:.0f} ms, the longest service seen)",
            lambda r: r["assured_rate"] <= mu_sat and r["deadline_ms"] <= service_max_ms,
        ),
        (
            "in the remaining cells (within capacity, d above every service)",
            lambda r: r["assured_rate"] <= mu_sat and r["deadline_ms"] > service_max_ms,
        ),
    )
    parts = []
    for where, pick in groups:
        c = _causes(on_rows, pick)
        parts.append(
            f"{sum(c.values())} {where}: {c['assured']} assured, {c['overtaken']} "
            f"opportunistic overtaken by an assured request that arrived after it, "
            f"{c['queued']} opportunistic behind what was admitted before it"
        )
    total = _causes(on_rows, lambda r: True)
    return (
        "; ".join(parts)
        + f". So {total['overtaken']} of the {total['overtaken'] + total['queued']} "
        "opportunistic firings dropped a request that waited while at least one assured "
        "request arriving after it started ahead of it: the learner admitted it on the queue "
        "it saw (its prediction within its SLO, d), and assured-first dispatch put later "
        "assured arrivals ahead of it, which the learner does not predict; each firing is "
        "sound (`now + L > D`; none could still have made it on the model). The grid is the "
        "catalogue's (the published grid is not stated): "
        "B = 10 and 14 put the assured stream past capacity, which is where the assured "
        "firings are"
    )


E15 = Experiment(
    "E15",
    "Doom gate: firings and false drops",
    "15 overload / tight-deadline guard cells: B ∈ {6, 10, 14} (assured paced at B/s) × d ∈ "
    "{1820, 1200, 800, 600, 400} ms under the 16/s flood, run as design §11 states E15: the "
    "published learner (the `published` predictor, sheddable-only, β = 1, SLO = d) governs "
    "the surplus, not an always-admit flood whose queue grows without bound. Gate on with the "
    f"published wiring, one constant L = {PUBLISHED_L_MS:.0f} ms (the batch-1 median) for "
    "every length, vs off, same seeds; reps 5. A false drop is a drop whose request would "
    "have been on time, decided by counterfactual replay: the same seed with the gate off, "
    "where the request is dispatched instead (the other doomed requests are too, so the "
    "replay is busier than dispatching that one request alone would be). Beside it, the "
    "drops with t + L_model(ℓ) ≤ D, L_model the profile's exact minimum service.",
    _e15,
    reps=5,
    shown=("floor", "deadline_ms", "doom_gate"),
    extra=_e15_extra,
    reading=_e15_reading,
)
