"""E3 (dispatch fault injection: assured-first vs FIFO at identical admission) and E4 (the
deadline sweep at a sub-capacity floor)."""

from __future__ import annotations

from collections.abc import Sequence

from floorguard.experiments import figures
from floorguard.experiments.catalogue._common import _range, _sweep
from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize
from floorguard.profiles import get_profile

E3_LEARNERS = ("always-admit", "predictor-sheddable")
"""The published composition (an admitter that lets nearly all of the offered load through,
so the admitted load itself is past capacity), and the marquee's shedding predictor."""


def _e3(quick: bool) -> list[Condition]:
    """The short grid (a smoke run, and the real backends' grid) keeps the marquee's
    learner alone, at two loads."""
    rates = (3.0, 16.0) if quick else (3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
    learners = E3_LEARNERS[1:] if quick else E3_LEARNERS
    return [
        Condition(
            policy=p,
            learner=learner,
            opp_rate=rate,
            replay_admission=p == "gated-fifo",
        )
        for learner in learners
        for rate in rates
        for p in ("guard", "gated-fifo")
    ]


def _overloaded_after_admission(rows: Sequence[RunRow]) -> str:
    """Whether the admitted load itself exceeds capacity (FIFO can fail only there)."""
    admitted = [s["rho_eff"] for s in summarize(rows) if s["rho_eff"] is not None]
    if not admitted:
        return ""
    low, high = min(admitted), max(admitted)
    where = "past" if low > 1 else "at or below" if high <= 1 else "on both sides of"
    return (
        f": the admitted load is {where} capacity (admitted ρ_eff {low:.2f}–{high:.2f}), "
        "so a FIFO queue builds behind the surplus it admitted, and assured-first dispatch "
        "is what keeps the floor's requests out of it"
    )


def _e3_learner(rows: Sequence[RunRow], learner: str) -> str:
    """One learner's half of the reading: per cell its admitted load and both misses."""
    mine = [r for r in rows if r["learner"] == learner]
    cells = []
    for s in summarize(mine):
        admitted = "" if s["rho_eff"] is None else f", admitted ρ_eff {s['rho_eff']:.2f}"
        cells.append(
            f"{s['policy']} at opportunistic {s['opp_rate']:g}/s (ρ̂ {s['rho_hat']:.2f}"
            f"{admitted}, opportunistic unmet {s['o_unmet']:.2f}): assured miss {s['miss'].fmt()}"
        )
    return f"With `{learner}`: " + "; ".join(cells) + _overloaded_after_admission(mine) + "."


def _e3_reading(rows: Sequence[RunRow]) -> str:
    replayed = [r for r in rows if r["replay_admission"]]
    identical = sum(bool(r["admission_identical"]) for r in replayed)
    return (
        f"Admission was byte-identical in {identical} of {len(replayed)} FIFO runs (the "
        "admitted set equal to the assured-first run's of the same seed). The only "
        "difference is the dispatch order, so each gap is what ordering alone buys. "
        + " ".join(
            _e3_learner(rows, learner)
            for learner in E3_LEARNERS
            if any(r["learner"] == learner for r in rows)
        )
    )


E3 = Experiment(
    "E3",
    "Dispatch fault injection: assured-first vs FIFO at identical admission",
    "Guard admission, floor B = 6, assured paced 6/s, opportunistic Poisson swept over "
    "{3, 4, 6, 8, 12, 16}/s (ρ̂ from ≈ 1 to the marquee flood), doom gate off, under two "
    "admitters: the published composition, one that lets the offered load through "
    "(`always-admit`: the admitted load itself is past capacity), and the marquee's "
    "learner (the `published` predictor, sheddable-only, β = 1), which sheds most of the "
    "flood. "
    "Assured-first (`guard`) vs FIFO (`gated-fifo`) on byte-identical admission: the FIFO "
    "run's learner is replaced by the assured-first run's admission decisions of the same "
    "seed (the floor's own decisions depend only on arrivals), and the row says whether the "
    "admitted sets matched.",
    _e3,
    reps=10,
    shown=("learner", "opp_rate", "policy"),
    figures=(figures.priority_vs_fifo,),
    reading=_e3_reading,
)

# -- E4–E7: deadlines, reservations, the operating region ---------------------------------


def _e4_limits(rows: Sequence[RunRow]) -> str:
    """Per profile: the tightest clean deadline against design §6's, and what is not tested."""
    parts = []
    for profile in dict.fromkeys(r["profile"] for r in rows):
        mine = sorted(
            (s for s in summarize(rows) if s["profile"] == profile), key=lambda s: s["deadline_ms"]
        )
        clean = [s for s in mine if s["a_late"] == 0]
        bound = get_profile(profile).ceiling.at(16) * (1 + -(-mine[0]["floor"] // mine[0]["slots"]))
        if clean:
            parts.append(
                f"{profile} holds down to d = {clean[0]['deadline_ms']:g} ms against the §6 "
                f"deadline s_max·(1 + ⌈B/C⌉) = {bound * 1e3:.0f} ms"
            )
    return (
        "; ".join(parts) + ". What this does not test: nothing competes with the floor here (no "
        "opportunistic work, ρ_eff "
        + _range(summarize(rows), "rho_eff")
        + "), so a miss can come only from the floor's own requests and the service spread, "
        "not from SF's wait behind a running opportunistic job."
    )


E4_FLOORS = {"v100-moe": 4, "ada-fp8": 20}
"""Each profile's deadline sweep cell: V100's sub-capacity floor (ρ_eff ≈ 0.45), Ada's base
cell (B = 20 paced, ρ_eff 1.07: docs/design.md §11)."""


def _e4(quick: bool) -> list[Condition]:
    deadlines = (1856, 1000, 350) if quick else (1856, 1600, 1400, 1200, 1000, 800, 650, 500, 350)
    return [
        Condition(floor=b, assured_rate=float(b), opp_rate=0.0, deadline_ms=d, profile=p)
        for p, b in E4_FLOORS.items()
        for d in deadlines
    ]


E4 = Experiment(
    "E4",
    "Deadline sweep at a sub-capacity floor",
    "The assured stream alone (no opportunistic flood), paced B/s (each window offers "
    "exactly B), d from 1856 down to 350 ms, guard, doom gate off: v100-moe at B = 4 (ρ_eff "
    "≈ 0.45 comes from it), ada-fp8 at its base cell B = 20 (ρ_eff 1.07, design §11).",
    _e4,
    reps=10,
    shown=("profile", "deadline_ms"),
    reading=lambda rows: _sweep(rows, "deadline_ms", "d") + " " + _e4_limits(rows),
)
