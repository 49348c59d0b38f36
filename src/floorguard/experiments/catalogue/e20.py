"""E20: the surplus shared fairly (docs/design.md §15) — a polite tenant beside a flooder."""

from __future__ import annotations

from collections.abc import Sequence

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment

LEARNERS = ("always-admit", "predictor-sheddable")
SURPLUS = ("learner", "fair")
POLITE = (1.0, 2.0)
"""The polite tenant's rate: the issue's 2/s, and 1/s (under a fair half of this surplus)."""
SHAPES_SURPLUS = ("learner", "fair", "fair-tokens")
"""The shapes cells: the fair queue charging slot time (`fair`) beside charging metered
tokens (`fair-tokens`, the earlier charge) and the learner's single order."""
POLITE_PROMPT_TOKENS, FLOOD_TOKENS = 1000, 160
"""The shapes cells: the polite tenant's long prompts (ℓ = 16), the flooder's long outputs."""


def _e20(quick: bool) -> list[Condition]:
    duration_s = 6.0 if quick else 12.0
    equal = [
        Condition(
            workload="polite",
            learner=learner,
            surplus=surplus,
            opp_rate=40.0,
            polite_rate=polite,
            duration_s=duration_s,
        )
        for polite in POLITE
        for learner in LEARNERS
        for surplus in SURPLUS
    ]
    shapes = [
        Condition(
            workload="polite",
            surplus=surplus,
            opp_rate=40.0,
            polite_rate=2.0,
            polite_prompt_tokens=POLITE_PROMPT_TOKENS,
            flood_tokens=FLOOD_TOKENS,
            duration_s=5 * duration_s,  # a flood request holds its slot ≈ 4 s: a long run
        )
        for surplus in SHAPES_SURPLUS
    ]
    return equal + shapes


def _equal(rows: Sequence[RunRow]) -> list[RunRow]:
    return [r for r in rows if not r["polite_prompt_tokens"]]


def _shaped(rows: Sequence[RunRow]) -> list[RunRow]:
    return [r for r in rows if r["polite_prompt_tokens"]]


def _share(runs: Sequence[RunRow], who: str) -> str:
    if who == "polite":
        on_time = sum(r["polite_on_time"] for r in runs)
        admitted = sum(r["polite_admitted"] for r in runs)
        offered = sum(r["polite_offered"] for r in runs)
    else:
        on_time = sum(r["flood_on_time"] for r in runs)
        admitted = sum(r["flood_admitted"] for r in runs)
        offered = sum(r["flood_offered"] for r in runs)
    share = on_time / offered if offered else 0.0
    return f"{on_time}/{offered} on time ({share:.0%}; {admitted} admitted)"


def _slot_share(runs: Sequence[RunRow]) -> float:
    """The polite tenant's share of the slot time the two surplus tenants held while both
    were sending."""
    polite = sum(r["polite_slot_s"] for r in runs)
    total = polite + sum(r["flood_slot_s"] for r in runs)
    return polite / total if total else 0.0


def _median_wait(runs: Sequence[RunRow], who: str) -> float:
    waits = sorted(w for r in runs if (w := r[f"{who}_wait_p50_s"]) is not None)  # type: ignore[literal-required]
    return waits[len(waits) // 2] if waits else float("nan")


def _shapes_table(rows: Sequence[RunRow]) -> list[str]:
    lines = [
        "",
        f"Shapes: the polite tenant's {POLITE_PROMPT_TOKENS}-token prompts with ℓ = 16 at 2/s "
        f"beside a flooder of ℓ = {FLOOD_TOKENS} at 40/s (always-admit), 60 s:",
        "",
        "| surplus | polite share of the surplus slot time (while sending) | "
        "polite median wait (s) | "
        "flooder median wait (s) | polite tenant | assured late |",
        "|---|---|---|---|---|---|",
    ]
    for surplus in SHAPES_SURPLUS:
        runs = [r for r in _shaped(rows) if r["surplus"] == surplus]
        if not runs:
            continue
        lines.append(
            f"| {surplus} | {_slot_share(runs):.1%} | {_median_wait(runs, 'polite'):.2f} | "
            f"{_median_wait(runs, 'flood'):.2f} | {_share(runs, 'polite')} | "
            f"{sum(r['a_late'] for r in runs)} |"
        )
    return lines


def _extra(rows: Sequence[RunRow]) -> str:
    shaped = _shapes_table(rows) if _shaped(rows) else []
    rows = _equal(rows)
    lines = [
        "| polite rate | learner | surplus | polite tenant | flooder (40/s) | assured late | "
        "floor attainment |",
        "|---|---|---|---|---|---|---|",
    ]
    for polite in POLITE:
        for learner, surplus in ((x, y) for x in LEARNERS for y in SURPLUS):
            runs = [r for r in _cell(rows, polite, learner) if r["surplus"] == surplus]
            if not runs:
                continue
            late = sum(r["a_late"] for r in runs)
            attained = [r["attainment"] for r in runs if r["attainment"] is not None]
            attainment = min(attained) if attained else float("nan")
            lines.append(
                f"| {polite:g}/s | {learner} | {surplus} | {_share(runs, 'polite')} | "
                f"{_share(runs, 'flood')} | {late} | {attainment:.3f} (worst run) |"
            )
    return "\n".join(lines + shaped)


def _cell(rows: Sequence[RunRow], polite: float, learner: str) -> list[RunRow]:
    return [r for r in rows if (r["polite_rate"], r["learner"]) == (polite, learner)]


def _polite_share(rows: Sequence[RunRow], polite: float, learner: str, surplus: str) -> float:
    runs = [r for r in _cell(rows, polite, learner) if r["surplus"] == surplus]
    offered = sum(r["polite_offered"] for r in runs)
    return sum(r["polite_on_time"] for r in runs) / offered if offered else 0.0


def _reading(rows: Sequence[RunRow]) -> str:
    shaped, rows = _shaped(rows), _equal(rows)
    parts = []
    for polite in POLITE:
        for learner in LEARNERS:
            before, after = (_polite_share(rows, polite, learner, s) for s in SURPLUS)
            parts.append(
                f"at {polite:g}/s under {learner}, the polite tenant's requests on time went "
                f"from {before:.0%} (one order for the surplus) to {after:.0%} (fair)"
            )
    late = {s: sum(r["a_late"] for r in rows if r["surplus"] == s) for s in SURPLUS}
    row = rows[0]
    surplus_per_s = row["mu_sat"] - row["assured_rate"]
    offered = " or ".join(f"{p:g}" for p in POLITE)
    return (
        "; ".join(parts).capitalize()
        + f". Assured late completions: {late['learner']} with the learner's order, "
        f"{late['fair']} with the fair one — the floor's queue is the same in both (fairness "
        "orders only what is not floor-entitled). What the fair share is here, from the "
        f"model: the backends serve μ_sat = {row['mu_sat']:.1f} req/s, the floor takes "
        f"{row['assured_rate']:g}/s, so the surplus is about {surplus_per_s:.1f}/s and a fair "
        f"half of it {surplus_per_s / 2:.1f}/s, against the polite tenant's "
        f"{offered}/s offered: where that half is below what it offers, its own "
        "share is overloaded and its queue grows (fairness bounds what the flood takes from "
        "it, not what it asks beyond its share). Fair dispatch orders what was admitted; it "
        "does not admit: where the learner refuses a tenant's arrival (the predictor sheds "
        "by load, whoever sent it), dispatch cannot give that request its share."
        + _shapes_reading(shaped)
    )


def _shapes_reading(rows: Sequence[RunRow]) -> str:
    if not rows:
        return ""
    share = {s: _slot_share([r for r in rows if r["surplus"] == s]) for s in SHAPES_SURPLUS}
    wait = {s: _median_wait([r for r in rows if r["surplus"] == s], "polite")
            for s in SHAPES_SURPLUS}  # fmt: skip
    fair = [r for r in rows if r["surplus"] == "fair"]
    late = "/".join(
        str(sum(r["a_late"] for r in rows if r["surplus"] == s)) for s in SHAPES_SURPLUS
    )
    longest = max(r["max_service_s"] for r in rows)
    deadline = fair[0]["deadline_ms"] / 1e3
    return (
        f" Shapes: with {POLITE_PROMPT_TOKENS}-token prompts and 16-token outputs beside a "
        f"{FLOOD_TOKENS}-token flooder, the polite tenant held {share['fair']:.1%} of the "
        "surplus slot time while both were sending charged by slot time (`fair`; median "
        f"wait {wait['fair']:.2f} s), "
        f"{share['fair-tokens']:.1%} charged by metered tokens (`fair-tokens`; "
        f"{wait['fair-tokens']:.2f} s) and {share['learner']:.1%} in the learner's order "
        f"({wait['learner']:.2f} s). Charged tokens, each of its requests costs "
        f"{POLITE_PROMPT_TOKENS + 16} units against the flooder's ≈ {FLOOD_TOKENS}, though it "
        "holds a slot about a sixth as long (v100-moe's prefill does not grow with the "
        f"prompt). Charged slot time it gets {share['fair']:.0%}, not half: the floor leaves "
        "the surplus about one slot, so in the run the flooder starts only a handful of "
        "requests that each hold a slot for seconds, and a virtual-time fair queue evens "
        "the tenants' charged time only to within one request's charge each (the flooder's "
        "first requests also started before the polite tenant's first arrival); its demand "
        "(2/s) exceeds its half, so its queue grows either way. "
        f"Assured late: {late} (learner/fair/fair-tokens) — a surplus request holds its slot up to "
        f"{longest:.1f} s, past the floor's {deadline:.2f} s deadline: non-preemptive "
        "dispatch bounds a floor request's wait by the longest running request, so with "
        "ℓ = 160 surplus the floor is outside the region the start report checks, whatever "
        "the surplus order."
    )


E20 = Experiment(
    "E20",
    "Fair surplus: a polite tenant beside a flooder",
    "The marquee's assured tenant (B = 6, paced), an opportunistic flooder at 40 req/s "
    "and a polite opportunistic tenant at 1 or 2 req/s (Poisson), ℓ = 16, C = 4, v100-moe, "
    "d = 1820 ms, 12 s; the guard with its surplus in one order (the learner's, then "
    "arrival: the published guard) or fair across tenants (docs/http.md: a virtual-time fair "
    "queue charging the slot time each request holds, within a tenant the learner's "
    "order); learners always-admit and the shedding predictor. Shapes cells: the polite "
    "tenant's 1,000-token prompts with ℓ = 16 beside a flooder of ℓ = 160, the fair queue "
    "charging slot time or metered tokens (`fair-tokens`). Reps 5. Not a published "
    "experiment: the fair surplus (docs/http.md), measured.",
    _e20,
    reps=5,
    shown=("polite_rate", "learner", "surplus"),
    extra=_extra,
    reading=_reading,
)
