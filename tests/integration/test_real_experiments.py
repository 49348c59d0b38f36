"""`floorguard experiment run … --backend` against the emulator: a real HTTP backend whose
service model is known (v100-moe), so this runs wherever the tests run (the same command
against real vLLM is in test_vllm.py)."""

from __future__ import annotations

import json

import pytest

from floorguard.calibrate import calibrate
from floorguard.cli import main


def test_the_real_backend_runner_on_the_emulator_matches_the_simulator(live, tmp_path):
    url = live.emulator("v100-moe", slots=4)
    calibrated = calibrate(url, "m", slots=4, reps=1)
    profile = tmp_path / "emulator.yaml"
    calibrated.save(profile, backend=url, model="m", slots=4)
    out = tmp_path / "out"
    argv = ["experiment", "run", "E1", "E3", "E5", "--backend", url, "--model", "m", "--profile",
            str(profile), "--quick", "--duration-s", "2.5", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0

    def rows(experiment, side):
        path = out / experiment / f"{side}_runs.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    for experiment in ("E1", "E3"):
        real, sim = rows(experiment, "real"), rows(experiment, "sim")
        # --quick: E1 two β × two stacks × two predictors, E3 two loads × two stacks
        assert len(real) == len(sim) == (8 if experiment == "E1" else 4)
        for r, s in zip(real, sim, strict=True):
            # the same seeded arrivals on both sides, each ending in one outcome
            assert (r["a_offered"], r["o_offered"]) == (s["a_offered"], s["o_offered"])
            assert sum(r["statuses"].values()) == r["a_offered"] + r["o_offered"]
            assert set(r["statuses"]) <= {"200", "429", "503"}, r
            if r["policy"] in ("guard", "gated-fifo"):
                assert r["log_violations"] == 0, r
    e1 = {(r["policy"], r["beta"]): r for r in rows("E1", "real") if r["predictor"] == "published"}
    assert e1["guard", 0.0]["a_late"] == 0 < e1["unguarded", 0.0]["a_late"], e1
    # E5 on a real backend: the reservation sweep of the reference profile only (--quick:
    # four floors, one rep), the assured stream alone
    e5 = rows("E5", "real")
    assert sorted(r["floor"] for r in e5) == [4, 6, 8, 10]
    assert all(r["o_offered"] == 0 for r in e5)
    fifo = [r for r in rows("E3", "real") if r["policy"] == "gated-fifo"]
    assert fifo and all(isinstance(r["admission_identical"], bool) for r in fifo)
    table = (out / "fidelity.md").read_text()
    assert "runs with a late A, real (CP 95 %)" in table
    assert "| guard | 0 | 1 |" in table and "| gated-fifo | 1 |" in table
    assert "agree on whether any assured request was late" in table
    assert (out / "fidelity.png").stat().st_size > 10_000


def test_e23_on_the_emulator_measures_first_tokens_from_streamed_answers(live, tmp_path):
    """E23 through the real-backend runner (docs/design.md §19): every answer streamed, the
    floor's first tokens timed by the client, the guard's log checked; with r = 2 reserved
    slots the floor's first tokens are on time, as the simulator says."""
    url = live.emulator("v100-moe", slots=4)
    calibrated = calibrate(url, "m", slots=4, reps=1)
    profile = tmp_path / "emulator.yaml"
    calibrated.save(profile, backend=url, model="m", slots=4)
    out = tmp_path / "out"
    argv = ["experiment", "run", "E23", "--backend", url, "--model", "m", "--profile",
            str(profile), "--quick", "--reps", "1", "--duration-s", "2.5",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    real = [json.loads(line) for line in (out / "E23" / "real_runs.jsonl").read_text().split("\n")
            if line]  # fmt: skip
    assert {(r["policy"], r["reserved_slots"]) for r in real} == {
        ("guard", 0), ("guard", 2), ("server-priority", 0), ("unguarded", 0)
    }  # fmt: skip
    for r in real:
        assert r["ttft_entitled"] > 0 and r["a_ttft_p99_s"] is not None, r
        assert sum(r["statuses"].values()) == r["a_offered"] + r["o_offered"]
        if r["policy"] == "guard":
            assert r["log_violations"] == 0, r
    reserved = next(r for r in real if r["reserved_slots"] == 2)
    assert reserved["ttft_met"] == reserved["ttft_entitled"], reserved
    sim = [json.loads(line) for line in (out / "E23" / "sim_runs.jsonl").read_text().split("\n")
           if line]  # fmt: skip
    for r, s in zip(real, sim, strict=True):  # the surplus's output, as the client saw it
        assert r["o_tokens_per_s"] == pytest.approx(s["o_tokens_per_s"], rel=0.3), (r, s)
    assert "floor's first tokens on time, real" in (out / "fidelity.md").read_text()
