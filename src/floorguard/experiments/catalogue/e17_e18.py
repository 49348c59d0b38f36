"""E17 and E18: the screen's overload and sub-saturation grids."""

from __future__ import annotations

import functools

from floorguard.experiments import screen_eval
from floorguard.experiments.spec import Experiment

E17 = Experiment(
    "E17",
    "Screen, overload grid",
    "40 configurations: {assured-first, FIFO} dispatch × B ∈ {2, 4, 6, 8} (assured paced "
    "B/s) × offered ρ̂ ∈ {1.08, 1.25, 1.6, 2.5, 4.06} (the opportunistic Poisson rate is "
    "ρ̂·μ_sat − B, μ_sat measured), C = 4, v100-moe, under the guard's admission with the "
    "published learner (the `published` latency predictor, sheddable-only, β = 1, its SLO "
    "1820 ms); doom gate off, so every admitted assured sojourn is measured whole, then "
    "re-thresholded at the 33 deadlines 300, 400, …, 3500 ms; reps 3. Screens: first-moment "
    "(the published kind, under evaluation) and makespan (floorguard's), side by side. The "
    "backend model is the fitted one of docs/calibration.md (dispersion and coupling).",
    screen_eval.e17_grid,
    reps=3,
    shown=("policy", "floor", "opp_rate"),
    figures=(
        functools.partial(screen_eval.screen_figure, knee=screen_eval.E17_KNEE),
        screen_eval.held_out_figure,
    ),
    extra=functools.partial(screen_eval.screen_extra, knee=screen_eval.E17_KNEE),
    reading=functools.partial(screen_eval.screen_reading, knee=screen_eval.E17_KNEE),
)

E18 = Experiment(
    "E18",
    "Screen, sub-saturation grid",
    "opportunistic Poisson {1, 2, 3}/s × C ∈ {4, 6, 8} × {assured-first, FIFO}, B = 6 "
    "(assured paced 6/s; B = 6 so that C = 4 reaches the knee), the same guard and learner "
    "as E17, v100-moe, doom gate off, 33 deadlines; reps 10. Precision by regime (ρ̂ < 1, "
    "ρ̂ ≥ 1) × aggregation; held-out calibration with p99 ŝ from one rep (10 %) tested on "
    "the other nine, rotated 10-fold, then blocks of 2–5 reps.",
    screen_eval.e18_grid,
    reps=10,
    quick_reps=3,
    shown=("policy", "slots", "opp_rate"),
    figures=(
        functools.partial(screen_eval.screen_figure, knee=screen_eval.E18_KNEE),
        screen_eval.held_out_figure,
    ),
    extra=functools.partial(screen_eval.screen_extra, knee=screen_eval.E18_KNEE),
    reading=functools.partial(screen_eval.screen_reading, knee=screen_eval.E18_KNEE),
)
