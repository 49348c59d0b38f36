from __future__ import annotations

import dataclasses
import pickle

import pytest

from floorguard.analysis.stats import Interval
from floorguard.cli import main
from floorguard.errors import FloorguardError
from floorguard.experiments import Condition, catalogue, run_condition
from floorguard.experiments.records import CONDITION_KEYS, ConditionKeys, Summary, run_row
from floorguard.experiments.runner import seed_for
from floorguard.experiments.tables import CONDITION_FIELDS, summarize
from tests.helpers import write_burstgpt


def test_catalogue_is_spec_e1_to_e19_and_e20_to_e23():
    """design §10's experiments, E20 (design §15's fair surplus), E21, E22 (design §16's
    memory) and E23 (design §19's first tokens), each with reps and a non-empty grid."""
    assert list(catalogue()) == [f"E{i}" for i in range(1, 24)]
    for e in catalogue().values():
        assert e.reps >= 1 and e.grid(False) and e.grid(True) and e.caption


def test_seeds_are_common_random_numbers():
    """Conditions compared within an experiment share seeds per rep; reps, slices and
    experiments differ."""
    guard, unguarded = Condition(policy="guard"), Condition(policy="unguarded", beta=2.0)
    assert seed_for("E1", 0, guard) == seed_for("E1", 0, unguarded)
    assert seed_for("E1", 0, guard) != seed_for("E1", 1, guard)
    assert seed_for("E1", 0, guard) != seed_for("E2", 0, guard)
    assert seed_for("E12", 0, Condition(slice_index=1)) != seed_for("E12", 0, Condition())


def test_identical_seeds_give_identical_admission_under_fifo_and_priority():
    """E3's premise: the guard and gated-FIFO admit exactly the same requests on one seed."""
    guard = run_condition(Condition(policy="guard", opp_rate=4.0), 11)
    fifo = run_condition(Condition(policy="gated-fifo", opp_rate=4.0), 11)
    for key in ("a_offered", "a_admitted", "a_rejected", "o_offered", "o_admitted"):
        assert guard[key] == fifo[key], key


def test_conditions_pickle_for_the_process_pool():
    """A Condition crosses process boundaries unchanged."""
    c = Condition(policy="flow-control", mapping_fault="swap", detail=True)
    assert pickle.loads(pickle.dumps(c)) == c


def test_summaries_pool_within_a_condition_only():
    """Counts pool within a condition, intervals are per condition, runs never mix."""
    rows = [
        run_condition(Condition(policy=p), seed) for p in ("guard", "unguarded") for seed in (1, 2)
    ]
    summaries = summarize(rows)
    assert [s["policy"] for s in summaries] == ["guard", "unguarded"]
    guard = summaries[0]
    assert guard["runs"] == 2
    assert guard["a_late"] == rows[0]["a_late"] + rows[1]["a_late"]
    assert isinstance(guard["miss"], Interval) and isinstance(guard["held"], Interval)
    assert guard["held"].estimate == (rows[0]["held"] + rows[1]["held"]) / 2


def test_run_rows_carry_every_spec_metric():
    """miss/unmet, attainment and its phase sweep, ρ_eff, ρ_emp from μ_sat, ρ̂, max Q_A,
    queue wait, DR firings."""
    row = run_condition(Condition(), 1)
    for key in (
        "a_miss",
        "a_unmet",
        "attainment",
        "attainment_worst_phase",
        "rho_eff",
        "rho_emp",
        "mu_sat",
        "rho_hat",
        "max_assured_backlog",
        "a_queue_wait_p99_s",
        "dr_firings",
        "false_drops",
        "a_wait_growth_ms_per_s",
        "fire_cv",
        "max_fire_lag_s",
        "inside_region",
    ):
        assert key in row, key
    assert row["false_drops"] == 0 and row["mu_sat"] > 5


def test_the_typed_records_declare_what_the_runs_and_summaries_carry():
    """The readings are type-checked against `RunRow` and `Summary`: the
    records must say what a run's row and a summary really hold, the condition's knobs
    with the same names and types as `Condition`'s fields."""
    knobs = {
        f.name: f.type
        for f in dataclasses.fields(Condition)
        if f.name not in ("detail", "keep_samples", "keep_ids")
    }
    declared = {k: v.__forward_arg__ for k, v in ConditionKeys.__annotations__.items()}
    assert declared == knobs
    assert set(CONDITION_KEYS) == set(CONDITION_FIELDS)
    rows = [run_condition(Condition(keep_samples=True, keep_ids=True, detail=True), 1)]
    assert run_row(rows[0]) is rows[0]
    (summary,) = summarize(rows)
    assert set(summary) == set(Summary.__annotations__)


def test_a_row_with_a_key_the_record_does_not_declare_is_refused():
    row = run_condition(Condition(), 1)
    row["a_mis"] = row.pop("a_miss")  # a producer's rename the readings would not see
    with pytest.raises(KeyError, match="a_mis"):
        run_row(row)


def test_experiment_cli_errors(capsys, tmp_path):
    """An unknown id or a bad --reps is exit 2 with a message; list prints the catalogue."""
    assert main(["experiment", "run", "E99", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert main(["experiment", "run", "E1", "--reps", "0", "--out", str(tmp_path)]) == 2
    assert main(["experiment", "list"]) == 0
    assert "E19" in capsys.readouterr().out


@pytest.mark.parametrize("experiment_id", ["E3", "E16"])
def test_single_experiments_run_by_id(tmp_path, experiment_id):
    """`run ID --reps 1` writes that experiment alone."""
    assert (
        main(
            [
                "experiment",
                "run",
                experiment_id,
                "--reps",
                "1",
                "--workers",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert (tmp_path / experiment_id / "table.md").is_file()
    assert (tmp_path / "report.md").is_file()


def test_e12_reads_a_real_burstgpt_csv_when_given(tmp_path):
    """`--burstgpt PATH` replaces E12's source, replayed at its own timestamps, sliced where
    its interarrival CV falls in the published range and its offered load is below
    capacity; a trace with no such slice is a clear error, not an empty table."""
    path = write_burstgpt(
        tmp_path / "burstgpt.csv", 3000, gap_s=0.2, response_tokens=lambda i: 10 + i % 30, cv=1.5
    )
    grid = catalogue(str(path))["E12"].grid(True)
    mine = [c for c in grid if c.trace_path == str(path)]
    assert mine and all(c.speedup == 1.0 for c in mine)
    row = run_condition(mine[0], 1)
    assert row["a_offered"] + row["o_offered"] > 0 and row["max_fire_lag_s"] == 0.0
    assert row["rho_hat"] < 1
    flooded = write_burstgpt(tmp_path / "flood.csv", 6000, gap_s=0.05, cv=1.5)  # 20/s
    with pytest.raises(FloorguardError, match="below capacity"):
        catalogue(str(flooded))["E12"].grid(True)


def test_e20_keeps_each_tenants_share_and_its_log_verifies():
    """E20's polite workload: three tenants, each one's counts on the row; the guard's
    decision log passes the checker (ORDER: assured-first holds under the fair surplus)."""
    from floorguard.analysis.checker import check_trace  # noqa: PLC0415
    from floorguard.experiments.conditions import build_scenario  # noqa: PLC0415
    from floorguard.sim.run import simulate_once  # noqa: PLC0415

    condition = Condition(workload="polite", opp_rate=40.0, polite_rate=1.0, duration_s=6.0)
    row = run_condition(condition, 3)
    assert row["polite_offered"] > 0 and row["flood_offered"] > 10 * row["polite_offered"]
    assert row["polite_on_time"] <= row["polite_admitted"] <= row["polite_offered"]
    run = simulate_once(build_scenario(condition), seed=3, policy="guard")
    report = check_trace(run.events)
    assert report.ok(), report.violations[:3]
    fair = dict(row)
    unfair = run_condition(dataclasses.replace(condition, surplus="learner"), 3)
    assert fair["polite_on_time"] > unfair["polite_on_time"]


def test_e10_counts_split_the_assured_misses_by_length():
    """E10's per-length counts add up: with the gate off the count meter admits every long
    (256-token, infeasible at d) request and each completes late, so the late ones that are
    not short are exactly the long ones admitted."""
    count = next(c for c in catalogue()["E10"].grid(True) if c.meter == "count")
    row = run_condition(count, seed_for("E10", 0, count))
    long_admitted = row["a_admitted"] - row["a_short_admitted"]
    assert long_admitted > 0 and row["a_late"] - row["a_short_late"] == long_admitted
    token = next(c for c in catalogue()["E10"].grid(True) if c.meter == "token")
    shed = run_condition(token, seed_for("E10", 0, token))
    assert shed["a_admitted"] == shed["a_short_admitted"]  # every long one is cost-excess
    assert shed["count_entitled_shed"] == long_admitted


def test_every_doom_gate_firing_is_accounted_for():
    """E15's accounting: each doomed drop has one cause (an assured request; an
    opportunistic one overtaken by a later assured arrival; or one behind what was admitted
    before it), and the causes add up to the firings. With the assured stream past capacity
    the firings are assured; within capacity they are opportunistic ones the assured-first
    order overtook."""
    from floorguard.experiments.catalogue.e15 import _e15  # noqa: PLC0415

    for condition in (c for c in _e15(quick=True) if c.doom_gate):
        row = run_condition(condition, seed=0)
        causes = row["doomed_causes"]
        assert sum(causes.values()) == row["dr_firings"] > 0
        assert causes["assured"] == row["dr_firings_assured"]
        if condition.floor == 6:  # 6/s assured, within the backend's capacity
            assert causes["assured"] == 0 and causes["overtaken"] > 0
