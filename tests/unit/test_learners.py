from __future__ import annotations

import numpy as np
import pytest

from floorguard.core.contract import ContractClass
from floorguard.core.learner import LoadSnapshot, is_well_formed
from floorguard.errors import ConfigError
from floorguard.experiments.conditions import Condition, learner_options_of
from floorguard.learners import (
    LatencyModel,
    LatencyPredictorAdmitter,
    LearnerOptions,
    Liar,
    ShedPolicy,
    create_learner,
    fit_latency_model,
)
from floorguard.profiles import V100_MOE
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.sim.probe import (
    PUBLISHED_SAMPLES,
    collect_probe_samples,
    fit_probe_model,
    latency_model_for,
    prediction_error,
)
from floorguard.sim.scenarios import marquee
from floorguard.sim.simulate import learner_options_for
from tests.helpers import make_request

ASSURED, OPP = ContractClass.ASSURED, ContractClass.OPPORTUNISTIC
RNG = np.random.default_rng(0)


def load(in_flight=0, queued=0):
    return LoadSnapshot(in_flight, queued, 0, 4)


def test_least_squares_recovers_a_known_linear_model():
    """On exact linear data the fit finds the coefficients, with R² = 1."""
    rng = np.random.default_rng(1)
    samples = []
    for _ in range(200):
        f, q, n = rng.integers(0, 5), rng.integers(0, 20), rng.integers(1, 100)
        samples.append((load(int(f), int(q)), int(n), 0.1 + 0.02 * f + 0.15 * q + 0.01 * n))
    model = fit_latency_model(samples)
    assert model.coefficients == pytest.approx((0.1, 0.02, 0.15, 0.01))
    assert model.r2 == pytest.approx(1.0) and model.num_samples == 200


def test_too_few_samples_is_a_clear_error():
    """Four coefficients need at least four samples."""
    with pytest.raises(ConfigError, match="probe samples"):
        fit_latency_model([(load(), 16, 0.3)])


def test_the_published_fit_spans_idle_to_saturated_in_132_samples():
    """docs/design.md §11's published predictor: 132 probe samples from idle to past saturation, so
    its queue feature varies and costs more than a running request; it predicts the whole
    probe set (every sample of every rate) about as well as its own 132."""
    model = fit_probe_model(V100_MOE, 4)
    assert model.num_samples == PUBLISHED_SAMPLES
    assert model.r2 > 0.98
    _, per_in_flight, per_queued, per_token = model.coefficients
    assert per_queued > per_in_flight > 0 and per_token > 0
    everything = collect_probe_samples(V100_MOE, 4)
    assert len(everything) > 500
    assert max(load.num_queued_entitled + load.num_queued_surplus for load, _, _ in everything) > 20
    assert prediction_error(model, everything) < 1.0  # seconds, on latencies up to tens of s


def test_the_light_only_fit_never_sees_a_queue():
    """The fit that stays beside it, named for what it is: light-load probes alone, so its
    queue coefficient is 0 and it predicts the same latency whatever the backlog."""
    model = fit_probe_model(V100_MOE, 4, fit="light-only")
    assert model.num_samples == PUBLISHED_SAMPLES and model.coefficients[2] == 0.0
    idle, flooded = LoadSnapshot(4, 0, 0, 4), LoadSnapshot(4, 200, 200, 4)
    assert model.predict_s(idle, 16) == model.predict_s(flooded, 16) < 1.82


def test_every_driver_builds_the_same_predictor():
    """One builder: `simulate --scenario marquee`, `experiment run E1` and `serve` with the
    same profile and C run the same fitted model."""
    built = latency_model_for("v100-moe", 4)
    simulated = learner_options_for(marquee(), "predictor-sheddable").latency_model
    experiment = learner_options_of(Condition(learner="predictor-sheddable")).latency_model
    served = (
        GuardServerConfig.model_validate(
            {
                "contracts": [{"tenant": "a", "class": "assured", "floor": 6, "deadline_ms": 1820}],
                "backends": [{"url": "http://127.0.0.1:9", "slots": 4}],
                "identity": {
                    "mode": "header",
                    "header": "X-Tenant",
                    "trusted_upstreams": ["127.0.0.1/32"],
                },
                "learner": "predictor-sheddable",
                "profile": "v100-moe",
            }
        )
        .learner_config()
        .latency_model
    )
    assert simulated == experiment == served == built
    with pytest.raises(ConfigError, match="predictor fit"):
        fit_probe_model(V100_MOE, 4, fit="loaded")


MODEL = LatencyModel((0.0, 0.0, 0.5, 0.0), num_samples=10, r2=1.0)  # 0.5 s per queued request


@pytest.mark.parametrize("beta", [0.0, 1.0, 100.0])
def test_sheddable_only_never_rejects_assured(beta):
    """Whatever β and load, the sheddable-only policy admits every assured request."""
    admitter = LatencyPredictorAdmitter(
        MODEL, beta=beta, slo_s=1.0, policy=ShedPolicy.SHEDDABLE_ONLY
    )
    assert admitter.propose(make_request(assured=True), ASSURED, load(queued=99), 0.0).admit


def test_class_agnostic_rejects_any_class_when_prediction_exceeds_slo():
    """admit iff β·pred ≤ SLO, for both classes; β = 0 admits everything."""
    admitter = LatencyPredictorAdmitter(
        MODEL, beta=1.0, slo_s=1.0, policy=ShedPolicy.CLASS_AGNOSTIC
    )
    assert admitter.propose(make_request(), ASSURED, load(queued=2), 0.0).admit  # 1.0 ≤ 1
    assert not admitter.propose(make_request(), ASSURED, load(queued=3), 0.0).admit  # 1.5 > 1
    assert not admitter.propose(make_request(assured=False), OPP, load(queued=3), 0.0).admit
    optimistic = LatencyPredictorAdmitter(
        MODEL, beta=0.0, slo_s=1.0, policy=ShedPolicy.CLASS_AGNOSTIC
    )
    assert optimistic.propose(make_request(), ASSURED, load(queued=1000), 0.0).admit


def test_liar_inverts_hints_and_relabels_classes():
    """Assured are proposed as opportunistic to the back; opportunistic as assured to the
    front. Both proposals are well formed: the guard must defend by construction."""
    liar = Liar()
    a = liar.propose(make_request(), ASSURED, load(), 0.0)
    o = liar.propose(make_request(assured=False), OPP, load(), 0.0)
    assert (a.proposed_class, o.proposed_class) == (OPP, ASSURED)
    assert a.priority_hint > o.priority_hint
    assert is_well_formed(a) and is_well_formed(o)


def test_registry_builds_every_learner_and_needs_a_model_for_predictors():
    """Each registered name builds; a predictor without a fitted model is a ConfigError."""
    options = LearnerOptions(beta=0.5, slo_s=1.0, latency_model=MODEL)
    for name in (
        "always-admit",
        "always-reject",
        "random",
        "liar",
        "predictor-sheddable",
        "predictor-agnostic",
        "calibrated-fifo",
    ):
        assert callable(create_learner(name, RNG, options).propose)
    assert create_learner("calibrated-fifo", RNG, options).beta == 1.0
    assert create_learner("predictor-agnostic", RNG, options).beta == 0.5
    with pytest.raises(ConfigError, match="fitted model"):
        create_learner("predictor-sheddable", RNG, LearnerOptions())
    with pytest.raises(ConfigError, match="must be one of"):
        create_learner("oracle", RNG)


def test_learner_from_an_import_path():
    """`package.module:factory` loads a user's learner; bad paths say why."""
    learner = create_learner("tests.plugins:make_learner", RNG)
    assert learner.propose(make_request(tokens=64), OPP, load(), 0.0).admit is False
    for bad, why in [
        ("tests.nowhere:make", "cannot import"),
        ("tests.plugins:missing", "cannot import"),
        ("tests.plugins:NOT_CALLABLE", "callable"),
    ]:
        with pytest.raises(ConfigError, match=why):
            create_learner(bad, RNG)


def test_random_learner_is_seeded():
    """Two random learners from equal seeds propose the same."""
    a = create_learner("random", np.random.default_rng(5))
    b = create_learner("random", np.random.default_rng(5))
    for _ in range(20):
        assert a.propose(make_request(), OPP, load(), 0.0) == b.propose(
            make_request(), OPP, load(), 0.0
        )
