"""The real-backend runner's pure parts: scaling a condition to a backend, the fidelity
section of the results file, and the command's refusals."""

from __future__ import annotations

import asyncio
import http.server
import threading
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from floorguard.cli import main
from floorguard.core.monitors import assumption_report
from floorguard.core.request import Request
from floorguard.errors import FloorguardError
from floorguard.experiments import Condition, catalogue, fidelity, real
from floorguard.experiments.conditions import mu_sat_of
from floorguard.experiments.fidelity import (
    admission,
    drift,
    paired_differences,
    preemptions,
    service_mean,
)
from floorguard.experiments.real import (
    RealBackend,
    backend_counters,
    backend_times,
    paired,
    scaled,
)
from floorguard.experiments.report import REAL_BEGIN, REAL_END, write_real_section
from floorguard.experiments.runner import Task, plan
from floorguard.experiments.tables import CONDITION_FIELDS
from floorguard.profiles import V100_MOE, save_profile
from floorguard.rig.loadgen import ClientResult, post_completion
from floorguard.sim.scenarios import ASSURED_TENANT, KV_PROMPT_TOKENS


def _backend(tmp_path, mu_sat, profile=V100_MOE):
    path = tmp_path / "profile.yaml"
    save_profile(profile, path, measured={"mu_sat_per_s": mu_sat})
    return RealBackend.from_profile("http://127.0.0.1:1/", "m", path)


def test_a_condition_scales_by_measured_capacity_deadlines_included(tmp_path):
    """Every time in a condition (window, run length, deadline) scales by k, so a deadline
    stays the same multiple of the measured sustained service C / μ_sat; the calibrated
    ceiling does not enter (it sits at another multiple of the service on another backend)."""
    marquee = Condition()
    same = scaled(marquee, _backend(tmp_path, mu_sat_of("v100-moe", 4)))
    assert same.assured_rate == pytest.approx(6.0) and same.window_s == pytest.approx(1.0)
    assert same.deadline_ms == pytest.approx(1820.0)
    assert same.profile.endswith("profile.yaml")

    half = scaled(marquee, _backend(tmp_path, mu_sat_of("v100-moe", 4) / 2))
    assert (half.assured_rate, half.opp_rate) == pytest.approx((3.0, 8.0))
    assert (half.window_s, half.duration_s) == pytest.approx((2.0, 24.0))
    assert half.deadline_ms == pytest.approx(3640.0)  # half the capacity: twice the service

    ceiling = V100_MOE.ceiling
    slower = replace(V100_MOE, ceiling=replace(ceiling, base_s=2 * ceiling.base_s,
                                               per_token_s=2 * ceiling.per_token_s))  # fmt: skip
    at_speed = scaled(marquee, _backend(tmp_path, mu_sat_of("v100-moe", 4), slower))
    assert at_speed.deadline_ms == pytest.approx(1820.0)  # same measured capacity: same d
    assert scaled(marquee, _backend(tmp_path, 9.0), duration_s=5).duration_s == 5
    service_ms = 4 / mu_sat_of("v100-moe", 4) * 1e3
    assert f"{1820 / service_ms:.2f} services → d = 3640 ms" in real.describe(
        _backend(tmp_path, mu_sat_of("v100-moe", 4) / 2), marquee
    )


def test_a_deadline_keeps_its_ratio_to_the_requests_own_service_prompt_included(tmp_path):
    """E21's deadline is written as the region's bound, so it keeps its factor over the
    request's own ceiling: its requests carry 100-token prompts, and on a backend that
    charges for prompts its deadline grows by the prompt's cost × the catalogue's factor
    (v100-moe charges none, so the factor is d / s_max(64) there); a deadline not written
    as the bound sees no prompt term."""
    charging = replace(V100_MOE, ceiling=replace(V100_MOE.ceiling, per_prompt_token_s=0.01))
    backend = _backend(tmp_path, mu_sat_of("v100-moe", 4), charging)
    memory = catalogue()["E21"].grid(True)[0]
    factor = memory.deadline_ms / 1e3 / V100_MOE.ceiling.at(64)
    assert scaled(memory, backend).deadline_ms == pytest.approx(
        factor * (V100_MOE.ceiling.at(64) + 0.01 * KV_PROMPT_TOKENS) * 1e3
    )
    assert scaled(Condition(), backend).deadline_ms == pytest.approx(1820.0)
    assert f"s_max(64, p = {KV_PROMPT_TOKENS})" in real.describe(backend, memory)
    assert "/s, 7.6 s)" in real.describe(backend, memory, 7.56)  # --duration-s, as run


def test_a_profile_without_a_measured_capacity_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    save_profile(V100_MOE, path)
    with pytest.raises(Exception, match="mu_sat_per_s"):
        RealBackend.from_profile("http://x", "m", path)


def test_the_fidelity_section_is_replaced_in_place_and_kept_by_the_simulator_report(tmp_path):
    results = tmp_path / "results.md"
    results.write_text("# Results\n\nsimulator tables\n")
    write_real_section(results, "first")
    write_real_section(results, "second")
    text = results.read_text()
    assert text.count(REAL_BEGIN) == 1 and "first" not in text and "second" in text
    assert text.startswith("# Results\n\nsimulator tables\n")

    assert main(["experiment", "run", "E3", "--reps", "1", "--out", str(tmp_path / "o"),
                 "--results-md", str(results)]) == 0  # fmt: skip
    text = results.read_text()
    assert "## E3" in text and text.count(REAL_BEGIN) == 1
    assert (
        text.index("## E3") < text.index(REAL_BEGIN) < text.index("second") < text.index(REAL_END)
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["E2", "--backend", "http://127.0.0.1:1", "--model", "m", "--profile", "P"],
         "simulator only"),
        (["E1", "--backend", "http://127.0.0.1:1"], "--backend needs --model"),
        (["E1", "--model", "m"], "go with --backend"),
        (["E1", "--backend", "http://127.0.0.1:1", "--model", "m", "--profile", "P",
          "--duration-s", "0"], "must be > 0"),
        (["E1", "E23", "--backend", "http://127.0.0.1:1", "--model", "m", "--profile", "P"],
         "E23 run alone"),
    ],
)  # fmt: skip
def test_the_real_backend_command_refuses_what_it_cannot_run(argv, message, tmp_path, capsys):
    profile = tmp_path / "p.yaml"
    save_profile(V100_MOE, profile, measured={"mu_sat_per_s": 9.0})
    argv = [str(profile) if a == "P" else a for a in argv]
    assert main(["experiment", "run", *argv, "--out", str(tmp_path / "o")]) != 0
    assert message in capsys.readouterr().err


VLLM_METRICS = """\
# HELP vllm:request_inference_time_seconds Histogram of time spent in RUNNING phase for request.
# TYPE vllm:request_inference_time_seconds histogram
vllm:request_inference_time_seconds_bucket{engine="0",le="+Inf",model_name="mid"} %(n)d
vllm:request_inference_time_seconds_count{engine="0",model_name="mid"} %(n)d
vllm:request_inference_time_seconds_sum{engine="0",model_name="mid"} %(service)f
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="mid"} %(n)d
vllm:request_queue_time_seconds_count{engine="0",model_name="mid"} %(n)d
vllm:request_queue_time_seconds_sum{engine="0",model_name="mid"} %(queue)f
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="mid"} %(preempted)d
# HELP vllm:request_num_preemptions Histogram of the number of times a request was preempted.
# TYPE vllm:request_num_preemptions histogram
vllm:request_num_preemptions_count{engine="0",model_name="mid"} %(n)d
vllm:request_num_preemptions_sum{engine="0",model_name="mid"} 0.0
"""


@pytest.fixture
def metrics_server():
    """A loopback HTTP server whose /metrics answers what the test sets."""
    state = {"body": b"", "status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", state
    server.shutdown()
    server.server_close()


def test_the_backends_own_service_during_a_run_comes_from_vllms_histograms(metrics_server):
    url, state = metrics_server
    state["body"] = (
        VLLM_METRICS % {"n": 10, "service": 4.0, "queue": 1.0, "preempted": 3}
    ).encode()
    before = backend_counters(url)
    state["body"] = (
        VLLM_METRICS % {"n": 30, "service": 16.0, "queue": 1.5, "preempted": 7}
    ).encode()
    during = backend_times(before, backend_counters(url))
    assert during == {
        "backend_requests": 20,
        "backend_service_mean_s": pytest.approx(0.6),
        "backend_queue_mean_s": pytest.approx(0.025),
        "backend_preemptions": 4,  # vLLM's own count of what its KV cache preempted
    }
    state["body"] = b"<html>not metrics</html>"
    assert backend_counters(url) is None
    state["status"] = 404
    assert backend_counters(url) is None
    assert backend_counters("http://127.0.0.1:1") is None  # nothing listening
    assert backend_times(None, before)["backend_service_mean_s"] is None


def test_runs_on_a_backend_off_its_calibrated_speed_are_named():
    def row(condition, rep, service, served=True):
        return {"condition": condition, "rep": rep, "served": served,
                "backend_requests": 50, "backend_service_mean_s": service}  # fmt: skip

    sim = [row(0, rep, 0.4) for rep in range(3)]
    steady = [row(0, 0, 0.42), row(0, 1, 0.38), row(0, 2, 0.44)]
    assert "no run was more than 25% off it" in drift(steady, sim)
    slowed = [row(0, 0, 0.42), row(0, 1, 0.6), row(0, 2, 0.2), row(0, 2, 9.0, served=False)]
    text = drift(slowed, sim)
    assert "2 of 3 runs were more than 25% off it** (1 faster, 1 slower)" in text
    assert "c0 rep 1 (1.50)" in text and "c0 rep 2 (0.50)" in text
    assert "0.50–1.50 ×" in text
    assert drift([{**r, "backend_service_mean_s": None} for r in slowed], sim) == ""
    assert service_mean(steady) == pytest.approx(0.4133, abs=1e-4)


def test_where_the_guard_misses_on_the_backend_is_said_with_its_cause():
    """Each deadline in the backend's own measured services, and each guard condition with a
    late assured request named with why: outside the region, or inside it where the
    simulator predicts it, or inside it where the simulator does not (the backend ran slower
    than its calibration). A stack with no decision log (vLLM's own priority) is not named."""
    e8 = catalogue()["E8"]

    def side(index, deadline_ms, late, *, guard=True, inside=True, service=0.2):
        base = {f: getattr(e8.grid(True)[index], f) for f in CONDITION_FIELDS}
        measured = {"a_late": late, "a_admitted": 20, "log_violations": 0 if guard else None}
        backend = {"backend_requests": 40, "backend_service_mean_s": service}
        region = {"inside_region": inside, "bound_s": 0.45}
        return [
            {
                **base,
                "condition": index,
                "rep": rep,
                "deadline_ms": deadline_ms,
                **measured,
                **backend,
                **region,
            }
            for rep in range(2)
        ]

    groups = {
        0: (side(0, 600, 0), side(0, 600, 0)),
        1: (side(1, 600, 3, guard=False), side(1, 600, 0)),
        2: (side(2, 420, 2, inside=False), side(2, 420, 1, inside=False)),
        4: (side(4, 500, 1), side(4, 500, 0)),
        6: (side(6, 520, 1), side(6, 520, 1)),
    }
    text = fidelity.guard_misses(e8, groups)
    assert "mean service during their runs: 2.10–3.00" in text
    assert "server-priority" not in text  # no decision log: not the guard
    assert "guard 420: 0.100 at d = 2.10 services (outside the region" in text
    assert "bound 450 ms against d = 420 ms" in text and "the simulator predicts 0.050" in text
    assert "guard 500: 0.050 at d = 2.50 services (inside the region, where the simulator " \
        "predicts none: the backend served slower" in text  # fmt: skip
    assert "guard 520: 0.050 at d = 2.60 services (inside the region, and the simulator " \
        "predicts 0.050 there too)" in text  # fmt: skip
    assert "guard 600" not in text
    assert "no late assured" in fidelity.guard_misses(e8, {0: groups[0]})
    silent = {0: ([{**r, "backend_service_mean_s": None} for r in groups[0][0]], groups[0][1])}
    assert fidelity.guard_misses(e8, silent) == ""


def test_e23s_reading_says_first_tokens_on_time_and_the_reservations_cost_from_its_rows():
    e23 = catalogue()["E23"]

    def side(index, met, tokens_per_s):
        base = {f: getattr(e23.grid(True)[index], f) for f in CONDITION_FIELDS}
        return [{**base, "condition": index, "rep": 0, "ttft_met": met, "ttft_entitled": 10,
                 "o_tokens_per_s": tokens_per_s}]  # fmt: skip

    groups = {
        0: (side(0, 8, 200.0), side(0, 4, 240.0)),
        1: (side(1, 10, 150.0), side(1, 10, 120.0)),
    }
    text = fidelity.first_tokens(e23, groups)
    assert "2 1000 guard 0: 80% (sim 40%); 2 1000 guard 2: 100% (sim 100%)" in text
    assert (
        "r = 2: 0.75× the surplus tokens/s of the guard without reserved slots (sim 0.50×)" in text
    )
    assert fidelity.first_tokens(catalogue()["E8"], {}) == ""


def test_whether_the_fifo_runs_admitted_what_the_assured_first_runs_did_is_said():
    assert admission([{"policy": "guard"}]) == ""
    assert "in 2 of 2 runs: the two orders were compared on identical" in admission(
        [{"admission_identical": True}, {"admission_identical": True}, {"policy": "guard"}]
    )
    text = admission([{"admission_identical": True}, {"admission_identical": False}])
    assert "in 1 of 2 runs" in text and "similar, not identical" in text


def test_the_real_runs_are_paired_back_to_back_with_the_order_alternating():
    """Each rep's two stacks run back to back on the same seed, guard first on even reps and
    server priority first on odd ones; every task runs once."""

    e8 = catalogue()["E8"]
    tasks = plan([e8], lambda _: 3, quick=True)
    ordered = paired(tasks)
    assert sorted(t.key for t in ordered) == sorted(t.key for t in tasks)
    for rep in range(3):
        mine = [t for t in ordered if t.rep == rep]
        assert len({t.seed for t in mine}) == 1  # one seed: the same arrivals for both
        assert [t.key for t in ordered[: len(mine) * (rep + 1)]][-len(mine) :] == [
            t.key for t in mine
        ]  # a rep's runs are consecutive
        policies = list(dict.fromkeys(t.condition.policy for t in mine))
        expected = ["guard", "server-priority"]
        assert policies == (expected if rep % 2 == 0 else expected[::-1])


def test_the_paired_difference_is_per_rep_with_a_t_interval():
    """Pairs are the same condition and seed across the two stacks; the table gives the
    mean of the per-rep differences and its 95 % t interval."""

    e8 = catalogue()["E8"]
    base = {f: getattr(Condition(), f) for f in CONDITION_FIELDS}
    rows = []
    # guard misses 0/10 in every rep; server priority 2/10, 4/10, 6/10
    for seed, late in ((1, 2), (2, 4), (3, 6)):
        for policy, a_late, goodput in (("guard", 0, 9.0), ("server-priority", late, 8.0)):
            rows.append(
                {**base, "policy": policy, "seed": seed, "deadline_ms": 900.0,
                 "a_late": a_late, "a_admitted": 10, "goodput_per_s": goodput}
            )  # fmt: skip
    text = paired_differences(e8, rows, CONDITION_FIELDS)
    assert "guard − server-priority" in text
    line = next(x for x in text.splitlines() if x.startswith("| 900"))
    # differences −0.2, −0.4, −0.6: mean −0.4, sd 0.2, t(0.975, 2) = 4.303 → ±0.497
    assert "| 3 | -0.400 [-0.897, +0.097] | +1.000 [+1.000, +1.000] |" in line


def test_e3s_admission_sentence_holds_when_the_fifo_run_comes_first(tmp_path, monkeypatch):
    """Paired order runs FIFO before assured-first on odd reps: the FIFO row still says
    whether it admitted the assured-first run's set, once that run is done."""
    backend = _backend(tmp_path, mu_sat_of("v100-moe", 4))
    admitted = {"guard": [1, 2, 3], "gated-fifo": [1, 2, 3]}

    def serve(c, seed, backend, folder):
        return [
            ClientResult(Request(i, ASSURED_TENANT, 0.0, 16), 0.0, 0.0, 0.0, 200)
            for i in admitted[c.policy]
        ], {}

    monkeypatch.setattr(real, "_serve_real", serve)
    monkeypatch.setattr(real, "backend_counters", lambda url: None)
    monkeypatch.setattr(real, "real_row", lambda c, seed, results, backend: {"policy": c.policy})
    runs = real._RealRuns(backend, tmp_path)
    guard = Condition(policy="guard")
    fifo = Condition(policy="gated-fifo", replay_admission=True)
    tasks = [Task("E3", 1, 1, fifo, 7), Task("E3", 0, 1, guard, 7)]
    rows = [runs(t) for t in tasks]
    assert rows[0]["admission_identical"] is True
    admitted["gated-fifo"] = [1, 2]
    again = [runs(Task("E3", 1, 3, fifo, 9)), runs(Task("E3", 0, 3, guard, 9))]
    assert again[0]["admission_identical"] is False


def _small_cache(tmp_path, kv_tokens, block=128):
    path = tmp_path / "profile.yaml"
    save_profile(V100_MOE, path, measured={"mu_sat_per_s": mu_sat_of("v100-moe", 4)})
    return RealBackend("http://127.0.0.1:1", "m", path, mu_sat_of("v100-moe", 4), kv_tokens, block)


def test_e21_runs_the_conditions_for_the_backends_own_kv_cache_in_its_blocks(tmp_path):
    backend = _small_cache(tmp_path, 512)  # vLLM CPU: --kv-blocks 4 of 128 tokens
    grid = catalogue()["E21"].grid(True)
    mine = [c for c in grid if real.holds_cache_of(c, backend)]
    assert {c.kv_blocks for c in mine} == {32} and len(mine) == len(grid) // 2  # 512 of 640
    budgeted = next(c for c in mine if c.kv_budget)
    on_it = scaled(budgeted, backend)
    assert (on_it.kv_blocks, on_it.kv_block_tokens) == (4, 128)  # the same 512 tokens
    scenario = real.build_scenario(on_it)
    assert scenario.kv_tokens == (512,) and scenario.backend_kv_blocks == (4,)
    assert scenario.kv_block_tokens == 128
    config = real._guard_config(on_it, backend, 8000, tmp_path / "log.jsonl")
    assert config.backends[0].kv_tokens == 512 and config.kv_block_tokens == 128
    forwarded = next(c for c in mine if c.forward_priority)
    assert real._guard_config(
        scaled(forwarded, backend), backend, 8000, tmp_path / "l"
    ).forward_priority
    assert all(c.workload != "kv-pressure" or real.holds_cache_of(c, backend) is False
               for c in grid if c.kv_blocks == 40)  # fmt: skip


def test_e22_stays_inside_the_budgets_region_on_a_backend_that_charges_for_prompts(tmp_path):
    """E22's deadline is design §6's bound under the budget; scaled to a backend whose ceiling
    charges for prompts (the CPU build's) it keeps d ≥ s_max(64, 100)·(1 + ⌈B/C⌉) there, C = 2
    of a 512-token cache, and A4 holds."""
    charging = replace(V100_MOE, ceiling=replace(V100_MOE.ceiling, per_prompt_token_s=0.01))
    path = tmp_path / "profile.yaml"
    save_profile(charging, path, measured={"mu_sat_per_s": mu_sat_of("v100-moe", 4)})
    backend = RealBackend("http://127.0.0.1:1", "m", path, mu_sat_of("v100-moe", 4), 512, 128)
    mine = [c for c in catalogue()["E22"].grid(True) if real.holds_cache_of(c, backend)]
    assert len(mine) == 4 and all(c.floor == 1 for c in mine)
    budgeted = scaled(next(c for c in mine if c.kv_budget), backend)
    report = assumption_report(
        real.build_scenario(budgeted).guard_config(),
        num_output_tokens=64,
        num_prompt_tokens=KV_PROMPT_TOKENS,
    )
    assert report.bound_s == pytest.approx(2 * charging.ceiling.at(64, KV_PROMPT_TOKENS))
    assert report.inside and budgeted.deadline_ms / 1e3 >= report.bound_s


def test_e21_runs_alone_and_only_on_a_backend_with_one_of_its_caches(tmp_path):
    experiments = catalogue()
    with pytest.raises(FloorguardError, match="run alone"):
        real.run_real_experiments(
            [experiments["E1"], experiments["E21"]], _small_cache(tmp_path, 512), out=tmp_path
        )
    for kv in (None, 384):  # reports no cache; a cache E21 is not written for
        with pytest.raises(FloorguardError, match=f"reports a KV cache of {kv} tokens"):
            real.run_real_experiments(
                [experiments["E21"]], _small_cache(tmp_path, kv), out=tmp_path
            )


def test_e21s_real_section_is_its_own_and_the_simulator_report_keeps_both(tmp_path):
    results = tmp_path / "results.md"
    results.write_text("# Results\n")
    write_real_section(results, "fidelity body")
    write_real_section(results, "memory body", "E21")
    write_real_section(results, "memory body, again", "E21")
    assert main(["experiment", "run", "E3", "--reps", "1", "--out", str(tmp_path / "o"),
                 "--results-md", str(results)]) == 0  # fmt: skip
    text = results.read_text()
    assert "fidelity body" in text and "memory body, again" in text
    assert "memory body\n" not in text and text.count(REAL_BEGIN) == 1
    assert text.index("## E3") < text.index(REAL_END) < text.index("memory body, again")


def test_e21s_fidelity_table_holds_vllms_preemption_count_beside_the_simulators():
    e21 = catalogue()["E21"]
    condition = e21.grid(True)[1]
    row = {**{f: getattr(condition, f) for f in CONDITION_FIELDS}, "condition": 1, "rep": 0}
    real_rows = [{**row, "backend_preemptions": 5}, {**row, "rep": 1, "backend_preemptions": 2}]
    sim_rows = [{**row, "preemptions": 4}, {**row, "rep": 1, "preemptions": 1}]
    table = preemptions(e21, real_rows, sim_rows)
    assert table.splitlines()[-1].endswith("| 7 | 5 |")
    assert preemptions(catalogue()["E1"], [{**row, "workload": "marquee"}], []) == ""


def test_a_real_run_sends_each_prompt_as_exactly_its_metered_tokens():
    """E21's 100-token prompts reach the backend as 100 token ids (what the guard meters and
    the KV cache holds); elsewhere, as before, a short text."""
    seen: list[object] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append((await request.json())["prompt"])
        return web.json_response({"choices": []})

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1/completions"
        request = Request(1, ASSURED_TENANT, 0.0, 8, 100)
        async with aiohttp.ClientSession() as session:
            assert (await post_completion(session, url, request, model="m"))[0] == 200
            exact = await post_completion(session, url, request, model="m", exact_prompts=True)
            assert exact[0] == 200
        await runner.cleanup()

    asyncio.run(run())
    assert seen[0] == "floorguard load" and seen[1] == [7] * 100
