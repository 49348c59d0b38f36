"""E1 and E2: the β sweeps of the sheddable-only and the class-agnostic learner, guard vs
unguarded (the marquee load)."""

from __future__ import annotations

from floorguard.experiments import figures
from floorguard.experiments.catalogue._common import (
    _against_published_29,
    _beta_grid,
    _by_predictor,
)
from floorguard.experiments.spec import Experiment

_PREDICTORS = (
    "Two latency predictors (least squares over in-flight, queued and ℓ, SLO = d; "
    "`sim.probe.latency_model_for`, the builder `simulate` and `serve` use too): "
    "`published`, as docs/design.md §11 states it, 132 samples from open-loop Poisson probes "
    "at 2 to 14/s (idle to past saturation) of the workload it then serves (ℓ = 16, as the "
    "marquee's), taken evenly over each probe's run, so it sees load and sheds; `light-only`, "
    "132 samples at Poisson 2/s alone, whose queue feature never varied: a learner that never "
    "sheds, reported beside it. Until this version the published fit's probes mixed in 30 % "
    "of ℓ = 64, which charged each queued 16-token request 194 ms, half again what it costs."
)
_MARQUEE = (
    "Marquee (C = 4, W = 1 s, B = 6, assured paced 6/s — 72 per run, each up to 20 ms late, "
    "so every window offers exactly B — opportunistic Poisson 16/s, ℓ = 16, d = 1820 ms, "
    "v100-moe, 12 s, doom gate off)."
)

E1 = Experiment(
    "E1",
    "β sweep, sheddable-only learner: guard vs unguarded",
    f"{_MARQUEE} Learner sheddable-only, β ∈ {{0, 0.5, 1, 2}}. {_PREDICTORS}",
    _beta_grid("predictor-sheddable"),
    reps=10,
    shown=("predictor", "policy", "beta"),
    figures=(figures.completion_vs_arrival,),
    reading=lambda rows: (
        _by_predictor(rows, "over the β sweep,")
        + (
            " Under the guard the learner only ever sees the surplus. Unguarded, the "
            "sheddable-only learner cannot shed assured requests, so whatever it admits of the "
            "flood queues in front of them."
        )
    ),
)

E2 = Experiment(
    "E2",
    "β sweep, class-agnostic learner: guard vs unguarded",
    f"As E1 with the class-agnostic predictor (it may reject assured requests too). {_PREDICTORS}",
    _beta_grid("predictor-agnostic"),
    reps=10,
    shown=("predictor", "policy", "beta"),
    reading=lambda rows: (
        _by_predictor(rows, "over the β sweep,", assured=True)
        + _against_published_29(rows)
        + (
            " Unguarded, a pessimistic class-agnostic learner refuses assured requests itself; "
            "under the guard its refusals cannot reach the floor."
        )
    ),
)
