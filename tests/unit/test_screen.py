from __future__ import annotations

import json
import math
from collections import deque

import pytest

from floorguard._compiled import running
from floorguard.cli import main
from floorguard.core import dispatcher as dispatcher_module
from floorguard.core.contract import DispatchOrder
from floorguard.core.guard import Dispatch
from floorguard.errors import ConfigError
from floorguard.screen import AdmissionPolicy, ScreenConfig, ScreenModel, aggregate, screen
from floorguard.screen.evaluate import VERDICTS, Cell, cells_for, clustered_scores, held_out, score
from tests.helpers import make_config, make_guard, make_request

PRIORITY, FIFO = DispatchOrder.ASSURED_FIRST, DispatchOrder.FIFO
MAKESPAN, FIRST_MOMENT = ScreenModel.MAKESPAN, ScreenModel.FIRST_MOMENT


def config(**kw):
    return ScreenConfig(**{"floor": 6, "slots": 4, "service_s": 0.4, **kw})


def test_priority_isolates_the_floor_from_opportunistic_load():
    """Assured-first: only the B assured are ahead, one in-progress job may delay them:
    ŝ·(1 + ⌈B/C⌉), whatever the opportunistic load."""
    for load in (4.0, 16.0, 100.0):
        v = screen(config(opportunistic_rate_per_s=load), 1.3, MAKESPAN)
        assert (v.ahead, v.terms["waves"], v.terms["residual"]) == (6, 2, 1)
        assert v.predicted_sojourn_s == pytest.approx(0.4 * 3) and v.accept
    alone = screen(config(), 1.0, MAKESPAN)
    assert alone.terms["residual"] == 0 and alone.predicted_sojourn_s == pytest.approx(0.8)


def test_fifo_counts_everything_ahead_and_is_unbounded_past_the_knee():
    """FIFO: the whole window is ahead; past ρ̂ = 1 the backlog grows without bound."""
    light = screen(config(dispatch=FIFO, opportunistic_rate_per_s=2.0), 2.0, MAKESPAN)
    assert light.ahead == 8 and light.predicted_sojourn_s == pytest.approx(0.4 * 2)
    heavy = screen(config(dispatch=FIFO, opportunistic_rate_per_s=5.0), 100.0, MAKESPAN)
    assert heavy.rho_hat > 1 and math.isinf(heavy.predicted_sojourn_s) and not heavy.accept


def test_first_moment_is_cobhams_mean_wait_on_c_slots():
    """ŝ + R/(1 − ρ_rel), R = min(ρ̂, 1)·ŝ/(2C): assured-first competes with the assured
    load only, FIFO with all of it; unbounded once ρ_rel ≥ 1; bounded under a flood with
    assured-first (R saturates at ŝ/(2C))."""
    s, c = 0.4, 4
    light = screen(config(opportunistic_rate_per_s=2.0), 1.0, FIRST_MOMENT)
    rho_a, rho = 6 * s / c, 8 * s / c
    assert light.rho_rel == pytest.approx(rho_a) and light.rho_hat == pytest.approx(rho)
    assert light.predicted_sojourn_s == pytest.approx(s + rho * s / (2 * c) / (1 - rho_a))
    flood = screen(config(opportunistic_rate_per_s=100.0), 1.0, FIRST_MOMENT)
    assert flood.predicted_sojourn_s == pytest.approx(s + s / (2 * c) / (1 - rho_a))
    fifo = screen(config(dispatch=FIFO, opportunistic_rate_per_s=2.0), 1.0, FIRST_MOMENT)
    assert fifo.rho_rel == pytest.approx(rho)
    assert fifo.predicted_sojourn_s == pytest.approx(s + rho * s / (2 * c) / (1 - rho))
    over = screen(config(dispatch=FIFO, opportunistic_rate_per_s=4.0), 100.0, FIRST_MOMENT)
    assert over.rho_rel >= 1 and math.isinf(over.predicted_sojourn_s) and not over.accept
    assert over.as_dict()["predicted_sojourn_s"] is None
    assert over.as_dict()["terms"]["wait_s"] is None and over.as_dict()["model"] == "first-moment"


@pytest.mark.parametrize("model", list(ScreenModel))
def test_admission_follows_the_shipped_meter(model):
    """Under the guard at most B assured per window are admitted; admit-all takes them all."""
    guard = screen(config(assured_rate_per_s=10.0), 5.0, model)
    everyone = screen(
        config(assured_rate_per_s=10.0, admission=AdmissionPolicy.ADMIT_ALL), 5.0, model
    )
    assert (guard.admitted_assured_per_window, everyone.admitted_assured_per_window) == (6, 10)


def test_region_check_names_the_failing_assumption():
    """§6 needs the meter, assured-first dispatch, ρ_a ≤ 1 and d ≥ s_max·(1 + ⌈B/C⌉)."""
    assert screen(config(), 1.3).inside_region
    assert screen(config(), 1.3, FIRST_MOMENT).inside_region
    fifo = screen(config(dispatch=FIFO), 1.3)
    assert not fifo.inside_region and "A2" in fifo.region_reasons[0]
    tight = screen(config(), 1.0)
    assert any(r.startswith("deadline") for r in tight.region_reasons)


def guard_dispatch_order(order, n_assured, n_opp, slots):
    """Feed the shipped Guard one window's arrivals in the screen's order and record the
    order it starts them in."""
    guard = make_guard(
        make_config(floor=n_assured, slots=(slots,), dispatch=order, deadline_s=100.0)
    )
    entries = sorted(
        [(i / n_assured, 1, True) for i in range(1, n_assured + 1)]
        + [(j / max(n_opp, 1), 0, False) for j in range(1, n_opp + 1)]
    )
    for rid, (_, _, assured) in enumerate(entries):
        guard.on_arrival(make_request(assured=assured, request_id=rid, at=0.0), 0.0)
    started, now = [], 0.0
    started += [d.request for d in guard.poll(now) if isinstance(d, Dispatch)]
    while guard.num_in_flight:
        now += 1.0
        guard.finish(next(iter(guard._in_flight)), now, "complete")
        started += [d.request for d in guard.poll(now) if isinstance(d, Dispatch)]
    return [r.tenant == "a95" for r in started]


@pytest.mark.parametrize("model", list(ScreenModel))
@pytest.mark.parametrize("order", [PRIORITY, FIFO])
def test_screen_conforms_to_the_guards_dispatch(order, model):
    """Both screens' `ahead` is where the shipped Guard starts the window's last assured
    request, for both dispatch rules; the first-moment screen's competing load is the
    opportunistic share the Guard starts ahead of it."""
    assured_flags = guard_dispatch_order(order, 6, 10, 4)
    position = max(i for i, a in enumerate(assured_flags) if a) + 1
    v = screen(config(dispatch=order, opportunistic_rate_per_s=10.0), 10.0, model)
    assert v.ahead == position
    assert v.ahead == (6 if order is PRIORITY else 16)  # the documented rules, pinned
    if model is FIRST_MOMENT:
        share = (position - 6) / 10
        assert v.rho_rel == pytest.approx((6 + share * 10.0) * 0.4 / 4)


@pytest.mark.skipif(
    running().startswith("compiled"),
    reason="patches the dispatcher's methods, which a compiled core calls natively; "
    "CI runs it on the pure core (FLOORGUARD_PURE=1)",
)
def test_changing_the_dispatch_rule_is_noticed(monkeypatch):
    """If assured-first dispatch served the surplus first, the pinned rule (ahead = B) breaks
    and the screen — built on the same dispatcher — follows the guard, not a copy."""

    def surplus_first(pop):
        def first(self):  # the class's own pop, with the floor's queue hidden from it
            assured, self._assured = self._assured, deque()
            ticket = pop(self)
            self._assured = assured
            return ticket if ticket is not None else pop(self)

        return first

    before = screen(config(opportunistic_rate_per_s=10.0), 10.0, FIRST_MOMENT)
    for cls in (dispatcher_module.AssuredFirstDispatcher, dispatcher_module.FairSurplusDispatcher):
        monkeypatch.setattr(cls, "pop", surplus_first(cls.pop))
    v = screen(config(opportunistic_rate_per_s=10.0), 10.0, MAKESPAN)
    assert v.ahead != 6
    flags = guard_dispatch_order(PRIORITY, 6, 10, 4)
    assert v.ahead == max(i for i, a in enumerate(flags) if a) + 1
    # the first-moment screen now counts the surplus as competing work, as the guard would
    after = screen(config(opportunistic_rate_per_s=10.0), 10.0, FIRST_MOMENT)
    assert after.rho_rel > before.rho_rel == pytest.approx(6 * 0.4 / 4)


def test_aggregations():
    """p50/median, p99, max and mean of the samples; unknown names and no samples refused."""
    samples = [0.1 * i for i in range(1, 101)]
    assert aggregate(samples, "max") == pytest.approx(10.0)
    assert aggregate(samples, "mean") == pytest.approx(5.05)
    assert aggregate(samples, "p50") == aggregate(samples, "median") == pytest.approx(5.05)
    assert aggregate(samples, "p99") == pytest.approx(9.901)
    with pytest.raises(ConfigError):
        aggregate(samples, "p95")
    with pytest.raises(ConfigError):
        aggregate([], "mean")


def test_scores_of_accept():
    """precision = TP/(TP+FP), recall = TP/(TP+FN), agreement, coverage."""

    def cell(accept, met, config="c"):
        return Cell(config, 1.0, 1.0, 0.5, 0.5, met, {}, {"makespan": accept})

    cells = (
        [cell(True, True)] * 3
        + [cell(True, False)]
        + [cell(False, True)] * 2
        + [cell(False, False)] * 4
    )
    s = score(cells, "makespan")
    assert (s.precision, s.recall, s.agreement, s.coverage) == (0.75, 0.6, 0.7, 0.4)
    assert score([cell(False, True)], "makespan").precision is None
    # the clustered interval's estimate is the pooled score; one cluster has no spread
    ci = clustered_scores(cells, "makespan", num_resamples=50)
    assert ci["precision"].estimate == 0.75 and ci["precision"].low == ci["precision"].high
    two = [cell(True, True, "a")] * 4 + [cell(True, False, "b")] * 4
    spread = clustered_scores(two, "makespan", num_resamples=200)["precision"]
    assert spread.low == 0.0 and spread.high == 1.0 and spread.estimate == 0.5


def fake_run(rep, services, sojourns):
    return {
        "rep": rep,
        "policy": "guard",
        "floor": 6,
        "slots": 4,
        "assured_rate": 6.0,
        "opp_rate": 0.0,
        "o_admitted_per_s": 0.0,
        "rho_hat": 0.6,
        "services": services,
        "a_sojourns": sojourns,
    }


def test_cells_rethreshold_measured_sojourns_at_33_deadlines():
    """One configuration gives 33 cells; the outcome is the measured p95 against each D."""
    runs = [fake_run(i, [0.4] * 50, [1.0] * 95 + [2.0] * 5) for i in range(2)]
    cells = cells_for("c", runs, runs, "mean")
    assert len(cells) == 33
    assert all(c.met == (c.deadline_s >= c.measured_p95_s) for c in cells)
    assert all(c.predicted_s["makespan"] == pytest.approx(0.8) for c in cells)
    assert all(set(c.accepts) == set(VERDICTS) for c in cells)
    # each cell's accepts are the screens' own verdicts at that deadline
    base = ScreenConfig(floor=6, slots=4, service_s=0.4, assured_rate_per_s=6.0)
    for c in cells:
        for model in ScreenModel:
            assert c.accepts[model.value] == screen(base, c.deadline_s, model).accept
        assert c.accepts["service-only"] == (c.deadline_s >= 0.4)
        assert not c.accepts["always-reject"]


def test_held_out_folds_rotate_and_keep_runs_disjoint():
    """Each fold calibrates ŝ on a rotating block and tests on the other runs only."""
    runs = [fake_run(i, [0.1 * (i + 1)] * 10, [0.5] * 20) for i in range(5)]
    block, folds = held_out({"c": runs}, 0.2, "mean")
    assert block == 1 and len(folds) == 5
    # calibrating on a slow run makes the screen reject more: folds differ by their block
    scores = [score(f, "makespan") for f in folds]
    assert len({(s.tp, s.fp, s.fn, s.tn) for s in scores}) > 1
    # fold i calibrates on run i alone: its ŝ is that run's service
    assert [f[0].service_s for f in folds] == pytest.approx([0.1 * (i + 1) for i in range(5)])
    assert held_out({"c": runs}, 0.5, "mean")[0] == 2  # round(0.5·5) = 2 of 5


def test_screen_cli(tmp_path, capsys):
    """--config YAML + --deadline-ms; --json prints the verdict; a bad config exits 2."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "floor: 6\nslots: 4\ndispatch: priority\nservice_s: 0.4\nopportunistic_rate_per_s: 16\n"
    )
    assert main(["screen", "--config", str(path), "--deadline-ms", "1300", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["accept"] and out["ahead"] == 6
    samples = tmp_path / "s.txt"
    samples.write_text("0.9\n1.0\n1.1\n")
    assert (
        main(
            [
                "screen",
                "--config",
                str(path),
                "--deadline-ms",
                "1300",
                "--service-samples",
                str(samples),
            ]
        )
        == 0
    )
    assert "REJECT" in capsys.readouterr().out
    args = ["screen", "--config", str(path), "--deadline-ms", "700", "--json"]
    assert main([*args, "--model", "first-moment"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "first-moment" and out["accept"]  # 400 + 50/(1 − 0.6) = 525 ms
    assert main(args) == 0  # the default, makespan: ŝ·(1 + ⌈6/4⌉) = 1200 ms
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "makespan" and not out["accept"]
    with pytest.raises(SystemExit):
        main([*args, "--model", "oracle"])
    path.write_text("floor: 6\nslots: 4\nwarp: 9\n")
    assert main(["screen", "--config", str(path), "--deadline-ms", "1000"]) == 2
    assert "unknown keys" in capsys.readouterr().err


def test_screen_reads_a_serve_config(monkeypatch, capsys, tmp_path):
    """`floorguard screen --config examples/guard.yaml`: B, C, W and dispatch from the serve
    config, ŝ from its profile (or --service-samples), the same verdict as the screen's own
    format with those values."""
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    samples = tmp_path / "s.txt"
    samples.write_text("0.5\n")
    args = ["screen", "--config", "examples/guard.yaml", "--deadline-ms", "1820", "--json"]
    assert main([*args, "--service-samples", str(samples), "--opportunistic-per-s", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    own = screen(config(floor=4, service_s=0.5, opportunistic_rate_per_s=16.0), 1.82, MAKESPAN)
    assert out["predicted_sojourn_s"] == pytest.approx(own.predicted_sojourn_s)
    assert out["accept"] == own.accept and out["ahead"] == own.ahead == 4  # its B


def test_screen_gives_one_verdict_per_model_of_a_pooled_serve_config(monkeypatch, capsys):
    """`models:` pools: each model screened with its own floors and slots."""
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    args = ["screen", "--config", "examples/guard-models.yaml", "--deadline-ms", "1820"]
    assert main([*args, "--json"]) == 0
    pools = json.loads(capsys.readouterr().out)["pools"]
    assert set(pools) == {"llama", "qwen"}
    assert (pools["llama"]["ahead"], pools["qwen"]["ahead"]) == (3, 2)  # B of each pool
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "model llama: " in text and "model qwen: " in text
