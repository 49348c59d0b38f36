from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from floorguard.cli import main
from floorguard.sim.scenarios import create_scenario
from floorguard.sim.simulate import simulate
from tests.helpers import write_burstgpt

CONTRACT_CLASS_KEYS = {"offered", "admitted", "rejected", "dropped", "late", "miss", "unmet"}


def run_json(capsys, *argv):
    """The command line's `--json` output."""
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def simulated(scenario="marquee", **options):
    """The library call behind `floorguard simulate --json`, through JSON (it is the wire
    contract: null for an undefined ratio)."""
    return json.loads(json.dumps(simulate(create_scenario(scenario), **options)))


def test_simulate_json_has_the_stable_contract():
    """--json prints one object with the documented fields, counts summed over reps."""
    out = simulated(reps=2, seed=3)
    for name in ("assured", "opportunistic"):
        assert out[name].keys() >= CONTRACT_CLASS_KEYS
    assert {"rho_eff", "max_assured_backlog", "reps", "wall_s", "sim_requests_per_s"} <= out.keys()
    assert "attainment" in out["assured"]
    assert out["reps"] == 2
    a = out["assured"]
    assert a["offered"] == a["admitted"] + a["rejected"]
    assert a["miss"] == pytest.approx(a["late"] / a["admitted"])


def test_simulate_is_deterministic_for_a_seed():
    """The same seed gives the same counts; another seed gives other arrivals."""
    first, again, other = simulated(seed=11), simulated(seed=11), simulated(seed=12)
    assert first["assured"] == again["assured"]
    assert first["assured"]["offered"] != other["assured"]["offered"] or (
        first["opportunistic"]["offered"] != other["opportunistic"]["offered"]
    )


def test_overrides_reach_the_guard(capsys):
    """--floor, --slots, --deadline-ms and --profile change the configuration used."""
    out = run_json(
        capsys,
        "simulate",
        "--floor",
        "3",
        "--slots",
        "2",
        "--deadline-ms",
        "900",
        "--profile",
        "deterministic",
        "--learner",
        "always-reject",
        "--json",
    )
    assert (out["floor"], out["slots"], out["deadline_ms"], out["profile"]) == (
        3,
        2,
        900.0,
        "deterministic",
    )
    assert out["opportunistic"]["admitted"] == 0
    assert out["max_assured_backlog"] <= 3


def test_zero_denominator_ratio_is_null():
    """With no opportunistic admissions, opportunistic miss is JSON null."""
    out = simulated(learner="always-reject")
    assert out["opportunistic"]["miss"] is None


def test_trace_out_then_verify(tmp_path, capsys):
    """A written trace verifies (exit 0); a tampered one fails (exit 1) naming AF."""
    path = tmp_path / "run.jsonl"
    assert main(["simulate", "--trace-out", str(path), "--json"]) == 0
    capsys.readouterr()
    assert main(["verify", str(path)]) == 0
    assert "OK" in capsys.readouterr().out
    lines = path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if '"entitled":true' in line)
    lines[i] = lines[i].replace('"entitled":true', '"entitled":false')
    path.write_text("\n".join(lines) + "\n")
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "first violation: AF" in out and "FAIL" in out


def test_multi_rep_trace_out_writes_one_file_per_rep(tmp_path, capsys):
    """--reps 2 with --trace-out writes FILE-rep0 and FILE-rep1."""
    assert (
        main(["simulate", "--reps", "2", "--trace-out", str(tmp_path / "t.jsonl"), "--json"]) == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t-rep0.jsonl", "t-rep1.jsonl"]


def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys):
    """A malformed trace or a bad value is an error message and exit 2, not a traceback."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "event": "arrive"}\n')
    assert main(["verify", str(bad)]) == 2
    assert "config event" in capsys.readouterr().err
    assert main(["simulate", "--floor", "0"]) == 2
    assert "floor = 0" in capsys.readouterr().err
    assert main(["simulate", "--reps", "0"]) == 2


def test_human_output_names_the_region(capsys):
    """Without --json the summary says whether the run is inside docs/design.md §6's region."""
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "floor-entitled attainment" in out and "docs/design.md §6 region" in out


@pytest.mark.data
def test_trace_scenario_replays_the_real_azure_trace(azure_dir, capsys):
    """--scenario trace replays a slice of the real Azure code trace through the guard;
    every replayed request is accounted for."""
    out = run_json(
        capsys,
        "simulate",
        "--scenario",
        "trace",
        "--trace",
        str(azure_dir / "AzureLLMInferenceTrace_code.csv"),
        "--trace-duration-s",
        "300",
        "--speedup",
        "3",
        "--json",
    )
    offered = out["assured"]["offered"] + out["opportunistic"]["offered"]
    assert offered > 300
    assert out["fire_cv"] > 1.5  # the code trace is bursty, and replay keeps it so
    assert out["max_fire_lag_s"] == 0.0


def test_trace_scenario_reads_burstgpt_and_needs_a_file(tmp_path, capsys):
    """A BurstGPT-format file replays; --scenario trace without --trace is a clear error."""
    path = write_burstgpt(
        tmp_path / "burst.csv", 400, gap_s=0.05, response_tokens=lambda i: 10 + i % 40
    )
    out = run_json(capsys, "simulate", "--scenario", "trace", "--trace", str(path), "--json")
    assert out["assured"]["offered"] + out["opportunistic"]["offered"] == 400
    assert main(["simulate", "--scenario", "trace"]) == 2
    assert "needs --trace FILE" in capsys.readouterr().err


def test_every_policy_runs_with_the_same_contract():
    """Each stack (`--policy`) gives the same JSON contract."""
    for policy in (
        "guard",
        "unguarded",
        "gated-fifo",
        "server-priority",
        "rate-limit-class",
        "rate-limit-flat",
        "flow-control",
    ):
        out = simulated(policy=policy)
        assert out["policy"] == policy
        assert out["assured"].keys() >= CONTRACT_CLASS_KEYS


def test_predictor_learner_reports_its_fit_and_beta():
    """A predictor learner is fitted once on probes; the JSON says β, sample count and R²."""
    out = simulated(policy="unguarded", learner="predictor-agnostic", beta=2.0)
    assert out["beta"] == 2.0
    assert out["learner_model"]["num_samples"] == 132 and out["learner_model"]["r2"] > 0.9
    # β = 2 over-predicts: the class-agnostic admitter sheds assured requests too
    assert out["assured"]["rejected"] > 0


def test_learner_by_import_path_and_bad_names(capsys):
    """--learner package.module:factory plugs in a user's learner; a bad one exits 2."""
    out = run_json(capsys, "simulate", "--learner", "tests.plugins:make_learner", "--json")
    assert out["opportunistic"]["admitted"] > 0
    assert main(["simulate", "--learner", "oracle"]) == 2
    assert "must be one of" in capsys.readouterr().err


def test_mapping_fault_reaches_flow_control(capsys):
    """--mapping-fault swap hands the assured class the sheddable objective: under the
    marquee's flood assured requests are shed, which they never are without the fault."""
    clean = run_json(capsys, "simulate", "--policy", "flow-control", "--json")
    swapped = run_json(
        capsys, "simulate", "--policy", "flow-control", "--mapping-fault", "swap", "--json"
    )
    assert clean["assured"]["rejected"] == 0
    assert swapped["assured"]["rejected"] > 0


def test_version_and_a_bad_port_are_clear_answers_not_tracebacks(capsys):
    """`--version` prints the installed version; a port outside 0–65535 is a usage error
    naming the range (it was an OverflowError from bind)."""
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("floorguard ")
    with pytest.raises(SystemExit) as done:
        main(["emulate", "--port", "99999"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "must be 0–65535" in err and "Traceback" not in err


def test_emulate_on_a_taken_port_is_a_clear_error(capsys):
    """A port in use ends `emulate` with exit 2 and the address in the message."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["emulate", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_token_mints_a_jwt_the_guard_of_that_config_accepts(monkeypatch, capsys):
    """`floorguard token` signs with the config's HS256 secret and the claims it checks; the
    guard's own identity names the tenant from it. An unknown tenant is a usage error."""
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415
    from floorguard.proxy.edge.identity import create_identity  # noqa: PLC0415

    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    assert main(["token", "--config", "examples/guard.yaml", "--tenant", "acme"]) == 0
    token = capsys.readouterr().out.strip()
    identity = create_identity(load_config("examples/guard.yaml").identity)
    assert identity.tenant_of({"Authorization": f"Bearer {token}"}) == "acme"
    assert main(["token", "--config", "examples/guard.yaml", "--tenant", "mallory"]) == 2
    assert "no contract for it" in capsys.readouterr().err


def test_simulate_a_serve_config_pool_by_pool(monkeypatch, capsys):
    """`simulate --config`: each model's pool under its own floors and slots; every assured
    tenant offers exactly its B per window (so the floor is all it asks for), the flood is
    2× the pool's capacity; the floor holds in both pools, and the flood is not served on
    time in full."""
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    assert main(["simulate", "--config", "examples/guard-models.yaml", "--json"]) == 0
    pools = json.loads(capsys.readouterr().out)["pools"]
    assert set(pools) == {"llama", "qwen"}
    assert (pools["llama"]["floor"], pools["qwen"]["floor"]) == (3, 2)
    for name, floor in (("llama", 3), ("qwen", 2)):
        assured = pools[name]["assured"]
        assert assured["offered"] == assured["entitled"] == floor * 12  # B per window, 12 s
        assert assured["attainment"] == 1.0 and assured["late"] == 0
        assert pools[name]["opportunistic"]["unmet"] > 0.3
    assert main(["simulate", "--config", "examples/guard-models.yaml", "--flood", "-1"]) == 2


def test_tool_edges_are_clear_answers_not_tracebacks(tmp_path, capsys, monkeypatch):
    """The tools' edges: `verify` on a missing file is a usage error (2) that names the
    file, not a traceback with exit 1 (its violation code); `load --help` prints a literal
    percent; `screen` on a serve config takes the deadline from its contracts."""
    missing = tmp_path / "nope.jsonl"
    assert main(["verify", str(missing)]) == 2
    assert f"cannot read {missing}: No such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    assert "(30 % assured)" in capsys.readouterr().out
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    assert main(["screen", "--config", "examples/guard.yaml", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["deadline_s"] == pytest.approx(1.82)  # acme's contract in the example


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`floorguard … --json | head`: the reader closes the pipe; the command stops with
    128 + SIGPIPE and no BrokenPipe traceback."""
    child = subprocess.Popen(
        [sys.executable, "-m", "floorguard", "simulate", "--scenario", "marquee", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before it writes
    with child.stderr:
        err = child.stderr.read().decode()
    assert child.wait(60) == 141, err
    assert "Traceback" not in err


def test_simulate_config_runs_the_configs_own_learner_unless_told(tmp_path, monkeypatch, capsys):
    """`simulate --config` ran always-admit whatever the config said (0 %
    refused where the live guard, with the predictor, refused most of a flood).
    It now runs the config's learner with its options, says so, and `--learner` wins."""
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 40)
    text = Path("examples/guard.yaml").read_text()
    config = tmp_path / "guard.yaml"
    config.write_text(
        text.replace("learner: always-admit", "learner: predictor-sheddable", 1).replace(
            "learner_options: {beta: 1.0}", "learner_options: {beta: 1.0, slo_ms: 600}", 1
        )
    )
    assert "learner: predictor-sheddable" in config.read_text()
    assert main(["simulate", "--config", str(config), "--json", "--duration-s", "6"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["learner"] == "predictor-sheddable" and "config" in own["learner_from"]
    assert own["opportunistic"]["rejected"] > 0  # the predictor sheds part of the flood
    told = ["simulate", "--config", str(config), "--json", "--duration-s", "6"]
    assert main([*told, "--learner", "always-admit"]) == 0
    admit_all = json.loads(capsys.readouterr().out)
    assert admit_all["learner"] == "always-admit" and admit_all["learner_from"] == "--learner"
    assert admit_all["opportunistic"]["rejected"] == 0


def test_bench_tenants_prints_each_cell_beside_the_smallest(capsys):
    """`bench tenants --json` (a tiny grid through the shipped Guard): one row per tenants ×
    backends cell, the first the reference (1.00), every decision counted."""
    from floorguard.bench.tenants import bench_tenants  # noqa: PLC0415  # only this test

    result = bench_tenants(tenants=(2, 50), backends=(1, 4), requests=200, repeats=1)
    rows = result["rows"]
    assert [(r["tenants"], r["backends"]) for r in rows] == [(2, 1), (2, 4), (50, 1), (50, 4)]
    assert rows[0]["decision_over_smallest"] == 1.0
    assert all(r["decision_us"] > 0 and r["config_s"] >= 0 for r in rows)
    assert main(["bench", "tenants", "--requests", "0"]) == 2
    assert "must be ≥ 1" in capsys.readouterr().err


def test_the_parser_loads_none_of_the_commands_heavy_modules():
    """`floorguard --help` (and every parse) builds the parser without the HTTP stack, the
    experiment suite or the numerical libraries: each command imports those when it runs
    (it took 1.6 s; an operator's first hour). Checked by what is imported, not by time."""
    import subprocess  # noqa: PLC0415  # only this test
    import sys  # noqa: PLC0415

    heavy = ("aiohttp", "redis", "scipy", "matplotlib", "pydantic", "floorguard.experiments")
    code = (
        "import sys; from floorguard.cli import build_parser; build_parser(); "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_help_shows_each_options_default(capsys):
    """`--help` names the defaults: of an option with words of help, after them; of one
    without, alone; none for a flag or an option whose default is None."""
    with pytest.raises(SystemExit):
        main(["emulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--port PORT (default: 8001)" in out
    assert "profile .yaml (default: v100-moe)" in out
    assert "(default: None)" not in out and "(default: False)" not in out
