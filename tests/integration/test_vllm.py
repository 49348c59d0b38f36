"""The guard in front of a real vLLM (CPU build, a small Llama with dummy weights and a
tokenizer trained here: `scripts/vllm_cpu.py make-model --size mid`, ≈ 13 ms per output
token alone, s_max(16) ≈ 0.66 s at C = 4, close to the published V100 timescale), over real
HTTP.

Needs `FLOORGUARD_VLLM_PYTHON`: the Python of a virtual environment with `vllm-cpu`
(`.ci/run` makes one and sets it; docs/vllm.md). Without it these tests skip with that
message, unless `FLOORGUARD_REQUIRE_VLLM=1` (set by `.ci/run`) makes that a failure;
`FLOORGUARD_SKIP_VLLM=1` skips them on purpose."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest

from floorguard.analysis.checker import check_trace
from floorguard.calibrate import calibrate
from floorguard.core.events import read_jsonl
from floorguard.core.request import Request
from floorguard.proxy.process.app import SERVER
from floorguard.rig.loadgen import replay
from tests.integration.live import guard_config, token
from tests.integration.processes import serve
from tests.redis_server import free_port

SCRIPT = Path(__file__).parents[2] / "scripts" / "vllm_cpu.py"
MODEL, SLOTS, SECONDS = "mid", 4, 6.0


@pytest.fixture(scope="module")
def vllm_python():
    if os.environ.get("FLOORGUARD_SKIP_VLLM") == "1":
        pytest.skip("FLOORGUARD_SKIP_VLLM=1")
    python = os.environ.get("FLOORGUARD_VLLM_PYTHON")
    if not python:
        message = "FLOORGUARD_VLLM_PYTHON is not set (a venv with vllm-cpu; see docs/vllm.md)"
        if os.environ.get("FLOORGUARD_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="module")
def vllm_model(vllm_python, tmp_path_factory):
    """The model directory (dummy weights, a tokenizer trained here)."""
    directory = tmp_path_factory.mktemp("vllm-model")
    subprocess.run(
        [vllm_python, str(SCRIPT), "make-model", str(directory), "--size", MODEL], check=True
    )
    return directory


@pytest.fixture(scope="module")
def vllm(vllm_python, vllm_model):
    """A vLLM server (priority scheduling, --max-num-seqs 4) for this module."""
    pid_file = vllm_model / "vllm.pid"
    started = subprocess.run(
        [vllm_python, str(SCRIPT), "serve", str(vllm_model), "--port", str(free_port()),
         "--pid-file", str(pid_file), "--name", MODEL, "--max-num-seqs", str(SLOTS)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    yield started.stdout.strip().splitlines()[-1]
    subprocess.run([vllm_python, str(SCRIPT), "stop", "--pid-file", str(pid_file)], check=True)


@pytest.fixture(scope="module")
def profile(vllm, tmp_path_factory):
    """This vLLM, calibrated (`floorguard calibrate`), as a profile file."""
    result = calibrate(vllm, MODEL, slots=SLOTS, reps=2, name="vllm-mid")
    path = tmp_path_factory.mktemp("profile") / "vllm-mid.yaml"
    result.save(path, backend=vllm, model=MODEL, slots=SLOTS)
    return path, result


def test_the_first_token_probe_holds_the_model_to_vllm(profile):
    """`calibrate`'s streamed probe (docs/design.md §19, docs/calibration.md "First tokens"):
    vLLM's time per output token is the model's `step(n)` to within its probe's noise
    (0.85–1.13× measured here); its first token is later than the model's — a fixed
    per-request cost of the API server, and batched prefills — by a bounded factor
    (1.3–2.2× measured here), and later with more requests starting together."""
    _, result = profile
    rows = result.first_tokens()
    assert sorted(rows) == [str(n) for n in range(1, SLOTS + 1)]
    for n, row in rows.items():
        assert 0.6 <= row["tpot_ms"] / row["tpot_model_ms"] <= 1.6, (n, row)
        assert 0.8 <= row["ttft_ms"] / row["ttft_model_ms"] <= 4.0, (n, row)
    assert rows[str(SLOTS)]["ttft_ms"] > rows["1"]["ttft_ms"]


def _pinned(tokens):
    return {"min_tokens": tokens, "ignore_eos": True}


def test_the_openai_client_through_the_guard_to_vllm(live, vllm):
    url, _ = live.guard(guard_config(vllm, slots=SLOTS))
    client = openai.OpenAI(base_url=url + "/v1", api_key=token("acme"), max_retries=0)
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=8, extra_body=_pinned(8)
    )
    assert raw.headers["x-floorguard-decision"] == "entitled"
    assert raw.parse().usage.completion_tokens == 8
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=_pinned(6),
        )
    )
    # streamed in pieces (a random-weight token can be a partial UTF-8 byte, which vLLM
    # holds back, so not every token is its own non-empty delta), and all 6 tokens came
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) >= 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    unasked = list(  # the guard asks vLLM for the usage, and keeps it from this client
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            extra_body=_pinned(5),
        )
    )
    assert unasked and all(c.choices for c in unasked)
    assert all(c.usage is None for c in unasked)
    client.close()
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    completion = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("floorguard_tokens_total{") and 'kind="completion"' in line
    )
    assert completion == 8 + 6 + 5  # what vLLM reported, the unasked stream's included


async def _running(vllm_url):
    async with aiohttp.ClientSession() as s, s.get(vllm_url + "/metrics") as r:
        text = await r.text()
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_running\{.*\} (\S+)$", text, re.M))


def test_a_client_abort_through_the_guard_aborts_the_vllm_request(live, vllm):
    url, app = live.guard(guard_config(vllm, slots=SLOTS, profile=None))  # no doom gate

    async def leave_early():
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url + "/v1/completions",
                headers={"Authorization": f"Bearer {token('acme')}"},
                json={"model": MODEL, "prompt": "x", "max_tokens": 1500, "stream": True,
                      **_pinned(1500)},
            ) as r,
        ):  # fmt: skip
            assert r.status == 200
            await r.content.readany()
            return await _running(vllm)

    assert live.run(leave_early()) == 1
    deadline = time.monotonic() + 10
    while (live.run(_running(vllm)) or app[SERVER].guard.num_in_flight) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert live.run(_running(vllm)) == 0 and app[SERVER].guard.num_in_flight == 0


def test_a_tenant_that_reuses_anothers_request_id_and_leaves_aborts_only_its_own(live, vllm):
    """vLLM names its request by the `x-request-id` it is sent. An opportunistic tenant that
    sends the id an assured tenant's running stream carries, then leaves, must abort its
    own request in vLLM and never the assured one. vLLM 0.32 makes ids unique itself; run
    with `VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1` (as older vLLM behaves) this failed with a
    504 until the guard sent each request upstream under an id of its own."""
    url, app = live.guard(guard_config(vllm, slots=SLOTS, profile=None))  # no doom gate
    shared = {"x-request-id": "req-000001"}

    async def stream(tenant, tokens, leave_early):
        body = {"model": MODEL, "prompt": "x", "max_tokens": tokens, "stream": True,
                "stream_options": {"include_usage": True}, **_pinned(tokens)}  # fmt: skip
        headers = {"Authorization": f"Bearer {token(tenant)}", **shared}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url + "/v1/completions", json=body, headers=headers) as r,
        ):
            assert r.status == 200
            if leave_early:
                await r.content.readany()
                return None
            return (await r.read()).decode()

    async def both():
        assured = asyncio.ensure_future(stream("acme", 120, leave_early=False))
        while await _running(vllm) < 1:
            await asyncio.sleep(0.02)
        await stream("free", 120, leave_early=True)
        return await assured

    text = live.run(both())
    assert text.rstrip().endswith("data: [DONE]"), text[-300:]
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 120
    deadline = time.monotonic() + 10
    while app[SERVER].guard.num_in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    assert app[SERVER].guard.num_in_flight == 0


async def _workload(url, seconds, opp_per_s, assured_per_s, priorities=None):
    """Open-loop: an opportunistic flood and an assured tenant at its floor; with
    `priorities` each body carries vLLM's `priority` (a request → priority mapping)."""

    async def one(session, tenant, at):
        await asyncio.sleep(at)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 16, **_pinned(16)}
        if priorities:
            body["priority"] = priorities[tenant]
        started = time.monotonic()
        try:
            async with session.post(
                url + "/v1/completions",
                json=body,
                headers={"Authorization": f"Bearer {token(tenant)}"},
            ) as r:
                await r.read()
                return tenant, r.status, time.monotonic() - started
        except aiohttp.ClientError:  # counted as a miss, never hidden
            return tenant, 0, time.monotonic() - started

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [one(session, "free", i / opp_per_s) for i in range(int(seconds * opp_per_s))]
        tasks += [
            one(session, "acme", 0.05 + i / assured_per_s)
            for i in range(int(seconds * assured_per_s))
        ]
        return [r for r in await asyncio.gather(*tasks) if r[0] == "acme"]


def test_the_floor_holds_on_vllm_where_admit_all_and_a_faulty_priority_mapping_miss(vllm, profile):
    """Deadline = 3 × s_max(16) of the calibrated profile. An opportunistic flood at 2× the
    measured μ_sat, the assured tenant at 2/s within its floor (3 per 1-s window), 6 s each:
    through the guard; straight into vLLM with a swapped priority mapping (assured 1, the
    flood 0: the untrusted learner's fault); and with the right mapping (vLLM's own
    priority baseline)."""
    path, calibrated = profile
    deadline_s = 3 * calibrated.profile.ceiling.at(16)
    flood = 2 * calibrated.mu_sat_per_s
    config = guard_config(vllm, floor=3, slots=SLOTS, profile=str(path)).model_dump(
        mode="json", by_alias=True
    )
    for contract in config["contracts"]:
        contract["deadline_ms"] = deadline_s * 1e3
    config["decision_log"] = str(path.parent / "decisions.jsonl")
    url, guard = serve(config, path.parent / "guard.yaml")  # its own process and event loop
    try:
        guarded = asyncio.run(_workload(url, SECONDS, flood, 2.0))
    finally:
        guard.send_signal(signal.SIGTERM)
        guard.wait(30)
    swapped = asyncio.run(_workload(vllm, SECONDS, flood, 2.0, {"acme": 1, "free": 0}))
    right = asyncio.run(_workload(vllm, SECONDS, flood, 2.0, {"acme": 0, "free": 1}))

    def late(results):
        return sum(status != 200 or latency > deadline_s for _, status, latency in results)

    report = check_trace(list(read_jsonl(config["decision_log"])))
    seen = {"guarded": guarded, "swapped": swapped, "right": right, "deadline_s": deadline_s}
    # the guard's own accounting: AF, DR (a drop only when provably doomed), no entitled
    # request completed late
    assert report.ok() and report.num_sf_late == 0, (report.violations[:3], seen)
    assert {status for _, status, _ in guarded} <= {200, 503}, seen  # 503: a sound drop
    # client-side (a drop counts as late), through this machine's jitter (2 cores)
    assert late(guarded) <= len(guarded) // 4, seen
    assert late(swapped) >= len(swapped) // 2, seen  # the faulty mapping starves the assured
    assert late(guarded) < late(swapped), seen

    def p50(results):
        return np.median([latency for *_, latency in results])

    assert p50(right) < p50(swapped)  # vLLM's priority scheduler really reorders


def test_the_load_generator_asks_vllm_for_its_own_model(vllm):
    """`floorguard load --model NAME`: a real backend refuses a model it does not serve."""
    requests = [Request(i, "acme", i * 0.05, 8) for i in range(8)]
    served = asyncio.run(replay(requests, vllm, {}, model=MODEL))
    assert [r.status for r in served] == [200] * 8
    refused = asyncio.run(replay(requests[:1], vllm, {}, model="no-such-model"))
    assert refused[0].status == 404


def test_the_real_backend_experiments_beside_the_simulator(vllm, profile, tmp_path):
    """`floorguard experiment run E1 E3 E8 --backend`: the CI subset (`--quick --reps 1
    --duration-s 6`; the full set is `docs/vllm.md`'s command). Every request ends in one
    outcome the client saw; every guard run's decision log checks; the guard keeps the
    assured class on time where the unguarded admit-all (β = 0) does not; the fidelity
    section lands in the results file beside the simulator's columns."""
    path, _ = profile
    out, results_md = tmp_path / "real", tmp_path / "results.md"
    results_md.write_text("# Results\n\n(simulator report)\n")
    subprocess.run(
        [sys.executable, "-m", "floorguard", "experiment", "run", "E1", "E3", "E8",
         "--backend", vllm, "--model", MODEL, "--profile", str(path), "--quick",
         "--reps", "1", "--duration-s", "6", "--out", str(out), "--results-md", str(results_md)],
        check=True,
    )  # fmt: skip
    rows = {
        e: [json.loads(line) for line in (out / e / "real_runs.jsonl").read_text().splitlines()]
        for e in ("E1", "E3", "E8")
    }
    # --quick: E1 two β × two stacks × two predictors, E3 two loads × two stacks
    assert [len(rows[e]) for e in rows] == [8, 4, 8]
    # vLLM's priority run never sees a deadline: one run, measured against E8's four
    assert sum(r["served"] for r in rows["E8"]) == 5
    for row in (r for e in rows for r in rows[e]):
        assert sum(row["statuses"].values()) == row["a_offered"] + row["o_offered"] > 0, row
        assert set(row["statuses"]) <= {"200", "429", "503"}, row  # nothing failed or lost
        if row["policy"] in ("guard", "gated-fifo"):
            assert row["log_violations"] == 0, row  # AF and DR hold in the guard's own log
        # vLLM's own account of the run: it ran what was forwarded, no more
        assert 0 < row["backend_requests"] <= row["statuses"].get("200", 0), row
        assert 0 < row["backend_service_mean_s"] < 30, row
    e1 = {(r["policy"], r["beta"]): r for r in rows["E1"] if r["predictor"] == "published"}
    assert e1["guard", 0.0]["a_late"] < e1["unguarded", 0.0]["a_late"], e1
    fifo = [r for r in rows["E3"] if r["policy"] == "gated-fifo"]
    assert all("admission_identical" in r for r in fifo), fifo
    text = results_md.read_text()
    assert text.startswith("# Results") and "fidelity of the simulator" in text
    assert text.count("| guard |") >= 3 and "| server-priority | " in text
    assert "service mean ms, vLLM's own" in text and "× the simulator's" in text


def test_e23_first_tokens_on_vllm(vllm, profile, tmp_path):
    """`floorguard experiment run E23 --backend` (docs/design.md §19), the CI subset (`--quick
    --reps 1 --duration-s 4`): a chat floor beside a flood of 256-token decodes, every
    answer streamed and its first token timed by the client. Every request ends in an
    answer the client saw, every guard log checks, and with r = 2 of 4 slots reserved the
    floor's first tokens come within their TTFT."""
    path, _ = profile
    out = tmp_path / "e23"
    subprocess.run(
        [sys.executable, "-m", "floorguard", "experiment", "run", "E23", "--backend", vllm,
         "--model", MODEL, "--profile", str(path), "--quick", "--reps", "1",
         "--duration-s", "4", "--out", str(out)],
        check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in (out / "E23" / "real_runs.jsonl").read_text().split("\n")
            if line]  # fmt: skip
    assert len(rows) == 4
    for row in rows:
        assert set(row["statuses"]) <= {"200", "429", "503"}, row
        assert sum(row["statuses"].values()) == row["a_offered"] + row["o_offered"] > 0, row
        assert row["ttft_entitled"] > 0 and row["a_ttft_p99_s"] is not None, row
        if row["policy"] == "guard":
            assert row["log_violations"] == 0, row
    reserved = next(r for r in rows if r["reserved_slots"] == 2)
    assert reserved["ttft_met"] == reserved["ttft_entitled"], reserved


def test_vllm_gets_only_the_work_the_guard_metered(live, vllm, profile):
    """Through the guard to real vLLM: a chat request with no cap runs the default 16 tokens
    (with `ignore_eos`, exactly), a client's `priority: -100` never reaches vLLM's priority
    scheduler, more `min_tokens` than the cap is refused before vLLM; and calibration found
    a prefill cost per prompt token on vLLM's real prefill, with L no steeper than a
    prefix-cache hit."""
    url, _ = live.guard(guard_config(vllm, slots=SLOTS))
    client = openai.OpenAI(base_url=url + "/v1", api_key=token("free"), max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"ignore_eos": True, "priority": -100},
    )
    assert chat.usage.completion_tokens == 16
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=1, extra_body={"min_tokens": 3000}
        )
    assert refused.value.code == "invalid_min_tokens"
    _, result = profile
    assert min(p for p, _ in result.prompt_s) >= 64  # vLLM counted the probe prompts
    fitted = result.profile
    assert fitted.prefill_per_prompt_token_s > 0  # a fresh prompt's prefill costs time
    assert fitted.lower_per_prompt_token_s <= fitted.prefill_per_prompt_token_s  # cache hits
    assert result.residuals["samples_below_L"] == 0


_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def test_vllm_bench_serve_through_the_guard(vllm, vllm_python, vllm_model, tmp_path):
    """vLLM's own benchmark client (`vllm bench serve`, from the vLLM environment) drives
    the guard in front of vLLM: random prompts, streamed, at 12 requests/s for one
    assured tenant with B = 4 per 1-s window (excess refused). Its report and the decision
    log agree: what it counts completed is what the guard completed — the floor — and what
    it counts failed is what the guard refused, or dropped as doomed where the backend was
    too slow for the floor (on a slow machine vLLM served these in 1.6 s, so 4 a window over
    4 slots queued past their deadlines: DR, not a fault); the log verifies."""
    log = tmp_path / "decisions.jsonl"
    config = guard_config(
        vllm, floor=4, slots=SLOTS, decision_log=str(log), excess_policy="reject"
    )  # the excess refused, not served as spare surplus (serve's default)
    url, process = serve(config.model_dump(mode="json", by_alias=True), tmp_path / "guard.yaml")
    try:
        bench = subprocess.run(
            [vllm_python, "-c", _BENCH, "--backend", "openai", "--base-url", url,
             "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", str(vllm_model),
             "--dataset-name", "random", "--random-input-len", "24", "--random-output-len", "8",
             "--num-prompts", "48", "--request-rate", "12", "--seed", "1",
             "--ignore-eos", "--ready-check-timeout-sec", "0", "--save-result",
             "--result-dir", str(tmp_path), "--result-filename", "bench.json", "--disable-tqdm"],
            env={**os.environ, "OPENAI_API_KEY": token("acme")},
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    result = json.loads((tmp_path / "bench.json").read_text())
    events = list(read_jsonl(str(log)))
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
    assert report.counts["complete"] == result["completed"] > 0
    errors = sorted({e for e in result.get("errors", []) if e})  # what the client saw
    refused = report.counts["reject"] + report.counts["drop"]
    assert refused == result["failed"] and report.counts["reject"] > 0, (report.counts, errors)
    assert result["completed"] + result["failed"] == 48
    # every admission was the floor's (the excess is refused), and it completed or was doomed
    assert report.num_entitled == result["completed"] + report.counts["drop"]
    assert result["completed"] <= 4 * (math.ceil(48 / 12) + 1)  # B per window, never more
    assert result["mean_ttft_ms"] > 0 and result["total_output_tokens"] == 8 * result["completed"]


def test_the_edges_field_bounds_on_vllm(live, vllm):
    """The edge's field bounds on the real backend: within them, the fields the guard
    bounds reach vLLM and it serves them (4 stop strings, a small `logit_bias`,
    `top_logprobs` 5 with at most 5 alternatives per token, `documents` in
    `chat_template_kwargs`, counted into the metered prompt); past them, or unmetered, a
    400 before vLLM."""
    url, _ = live.guard(guard_config(vllm, slots=SLOTS))
    client = openai.OpenAI(base_url=url + "/v1", api_key=token("free"), max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        stop=[f"zz{i}" for i in range(4)],
        logit_bias={"5": 1},
        logprobs=True,
        top_logprobs=5,
        extra_body={"chat_template_kwargs": {"documents": [{"text": "a short document"}]}},
    )
    assert chat.choices[0].logprobs is not None
    assert all(len(t.top_logprobs) <= 5 for t in chat.choices[0].logprobs.content)
    for extra, code in (
        ({"top_logprobs": 20, "logprobs": True}, "field_too_large"),
        ({"stop": [f"zz{i}" for i in range(5)]}, "field_too_large"),  # vLLM's own limit is 4
        ({"prompt_logprobs": 5}, "costly_field"),
        ({"chat_template_kwargs": {"chat_template": "{{ 'x' * 100 }}"}}, "costly_field"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, extra_body=extra
            )
        assert refused.value.code == code


def test_bench_backlog_holds_a_backlog_inside_vllm(vllm):
    """`floorguard bench backlog` really holds the backlog in vLLM's own queue (vLLM's
    gauge says so) with the probes running ahead of it, and reports each size beside the
    empty queue."""
    out = subprocess.run(
        [sys.executable, "-m", "floorguard", "bench", "backlog", "--backend", vllm,
         "--model", MODEL, "--waiting", "24", "--repeats", "1", "--json"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    rows = {r["waiting"]: r for r in json.loads(out.stdout)["rows"]}
    assert set(rows) == {0, 24}
    assert rows[0]["held_service_ratio"] == 1.0
    # the fillers were waiting inside vLLM while the probes ran; the gauge is read after
    # the probes are done, and by then the C freed slots may each have started a filler
    # (a CI run saw 21 of 24: three had started)
    assert rows[24]["waiting_seen"] >= 24 - SLOTS
    for row in rows.values():
        assert 0 < row["held_step_ms"] < row["held_service_ms"]


def test_bench_handoff_measures_both_queues_on_vllm(vllm):
    """`floorguard bench handoff`: a real guard process in front of vLLM and vLLM's own
    queue, each with requests that waited for a freed slot, and the guard's process gone
    afterwards."""
    out = subprocess.run(
        [sys.executable, "-m", "floorguard", "bench", "handoff", "--backend", vllm,
         "--model", MODEL, "--requests", "14", "--repeats", "1", "--json"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    result = json.loads(out.stdout)
    for name in ("direct", "guard"):
        path = result["paths"][name]
        assert path["handoffs"] >= 5, name  # 14 requests, the first 4 start at once
        assert 0 < path["median_ms"] <= path["p90_ms"]
    assert len(result["guard_adds_per_rep_ms"]) == 1
    # the guard process the bench started (its config in a floorguard-handoff- folder) is gone
    alive = subprocess.run(["pgrep", "-f", "floorguard-handoff-"], check=False, capture_output=True)
    assert alive.returncode == 1, alive.stdout


def test_the_metered_prompt_bounds_what_vllms_chat_template_renders(live, vllm, tmp_path):
    """VLLM renders any string as a role (a 2,000-byte role costs vLLM hundreds of
    prompt tokens), so through the guard such a role is a 400 `invalid_role`; every chat the
    guard forwards is metered at no fewer prompt tokens than vLLM reports for it."""
    direct = openai.OpenAI(base_url=vllm + "/v1", api_key="x", max_retries=0)
    stuffed = [{"role": "r" * 2000, "content": "hi"}]
    plain = [{"role": "user", "content": "hi"}]
    rendered = direct.chat.completions.create(model=MODEL, messages=stuffed, max_tokens=1)
    baseline = direct.chat.completions.create(model=MODEL, messages=plain, max_tokens=1)
    assert rendered.usage.prompt_tokens > baseline.usage.prompt_tokens + 100  # the hole, on vLLM
    log = tmp_path / "decisions.jsonl"
    url, app = live.guard(guard_config(vllm, slots=SLOTS, decision_log=str(log)))
    client = openai.OpenAI(base_url=url + "/v1", api_key=token("free"), max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=stuffed, max_tokens=1)
    assert refused.value.code == "invalid_role"
    chats = [
        plain,
        [{"role": "system", "content": "be brief " * 40}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "hi", "name": "n" * 300},
         {"role": "assistant", "content": "a" * 300}, {"role": "user", "content": "more"}],
    ]  # fmt: skip
    reported = [
        client.chat.completions.create(model=MODEL, messages=m, max_tokens=1).usage.prompt_tokens
        for m in chats
    ]
    live.flush_log(app)
    metered = [e.num_prompt_tokens for e in read_jsonl(str(log)) if e.kind.value == "arrive"]
    assert len(metered) == len(chats)
    assert all(m >= r for m, r in zip(metered, reported, strict=True)), (metered, reported)
