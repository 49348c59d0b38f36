"""SPEC §16 on a real vLLM (CPU build) started with a small KV cache: three of its 128-token
blocks (`scripts/vllm_cpu.py serve --kv-blocks 3`). The guard reads that cache from vLLM's
own `cache_config_info` (384 tokens, 128-token blocks). Four requests of 100 prompt tokens
and 60 output tokens each (one block at their start, two by their end) through the guard
dispatching by slots (C = 4) make vLLM preempt — counted by vLLM's own
`vllm:num_preemptions_total` — and through the guard budgeting the 384 tokens (one at a
time: each reserves 256) it preempts none. Both decision logs pass `verify` (MEMORY
included). Needs `FLOORGUARD_VLLM_PYTHON` as tests/integration/test_vllm.py does."""

from __future__ import annotations

import asyncio
import subprocess
import urllib.request

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from floorguard.analysis.checker import check_trace
from floorguard.core.events import read_jsonl
from floorguard.proxy.health import parse_backend_report
from tests.integration.live import guard_config, token
from tests.integration.test_vllm import MODEL, SCRIPT, vllm_model, vllm_python
from tests.redis_server import free_port

__all__ = ["vllm_model", "vllm_python"]  # the fixtures this module shares

KV_BLOCKS, BLOCK, SLOTS = 3, 128, 4
BODY = {
    "model": MODEL,
    "prompt": [7] * 100,  # token ids: counted exactly
    "max_tokens": 60,
    "min_tokens": 60,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def small_vllm(vllm_python, vllm_model):
    pid_file = vllm_model / "vllm-small-kv.pid"
    started = subprocess.run(
        [vllm_python, str(SCRIPT), "serve", str(vllm_model), "--port", str(free_port()),
         "--pid-file", str(pid_file), "--name", MODEL, "--max-num-seqs", str(SLOTS),
         "--kv-blocks", str(KV_BLOCKS)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    yield started.stdout.strip().splitlines()[-1]
    subprocess.run([vllm_python, str(SCRIPT), "stop", "--pid-file", str(pid_file)], check=True)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        return answer.read().decode()


def _preemptions(url: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(_metrics(url))
        if family.name.startswith("vllm:num_preemptions")
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def _four(url: str) -> list[int]:
    headers = {"Authorization": f"Bearer {token('acme')}"}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(url + "/v1/completions", json=BODY, headers=headers) as r:
                await r.read()
                return r.status

        return list(await asyncio.gather(*(one() for _ in range(4))))


@pytest.mark.parametrize("budget", [False, True], ids=["slots-only", "kv-budget"])
def test_vllm_preempts_under_slot_dispatch_and_never_under_the_kv_budget(
    live, small_vllm, tmp_path, budget
):
    report = parse_backend_report(_metrics(small_vllm))
    assert (report.kv_tokens, report.block_tokens) == (KV_BLOCKS * BLOCK, BLOCK)  # vLLM's word
    backend = {"url": small_vllm, "slots": SLOTS}
    if budget:
        backend["kv_tokens"] = KV_BLOCKS * BLOCK
    log = tmp_path / "decisions.jsonl"
    config = guard_config(
        small_vllm,
        floor=8,
        window_s=3600.0,
        decision_log=str(log),
        backends=[backend],
        kv_block_tokens=BLOCK,
        contracts=[{"tenant": "acme", "class": "assured", "floor": 8, "deadline_ms": 30_000}],
    )  # one at a time under the budget: a deadline that waits for the fourth
    url, app = live.guard(config)
    before = _preemptions(small_vllm)
    statuses = asyncio.run(_four(url))
    preempted = _preemptions(small_vllm) - before
    live.flush_log(app)
    print(f"vllm:num_preemptions_total rose by {preempted:g}")  # shown with -rP
    assert statuses == [200] * 4
    if budget:
        assert preempted == 0
    else:
        assert preempted > 0
    verified = check_trace(list(read_jsonl(str(log))), allow_open=True)
    assert {v.prop for v in verified.violations} <= {"SF"}, verified.violations[:3]
