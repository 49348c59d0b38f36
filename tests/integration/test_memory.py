"""The KV budget (docs/design.md §16) through a real `floorguard serve` over the emulator: a backend
with 64 KV tokens takes a 48-token request and holds the next one back until it ends — a
small surplus request that would fit does not overtake it — and a request no backend can
hold is refused at once, 429 `kv_excess`, no retry. The decision log passes `verify`, whose
MEMORY check holds the starts to the budget."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from floorguard.core.events import EventKind, read_jsonl
from floorguard.proxy.pool.health import parse_backend_report
from tests.integration.processes import emulate, floorguard, listening, stop
from tests.integration.test_attacks import _concurrently, _config, guard_process

BIG = ("acme", {"model": "m", "prompt": "x", "max_tokens": 40})  # 3 + 40 → 48 reserved
SMALL = ("free", {"model": "m", "prompt": "x", "max_tokens": 8})  # 3 + 8 → 16 reserved
HUGE = ("acme", {"model": "m", "prompt": "x", "max_tokens": 100})  # 112 > 64: never fits


def events_of(events, tenant):
    """The ids of `tenant`'s requests, in the order they arrived."""
    return [e.request_id for e in events if e.kind is EventKind.ARRIVE and e.tenant == tenant]


def test_a_backend_takes_what_its_kv_cache_holds_and_refuses_what_it_never_could(tmp_path):
    backend, process = emulate(slots=4)
    try:
        with guard_process(
            tmp_path,
            [backend],
            backends=[{"url": backend, "slots": 4, "kv_tokens": 64}],
            contracts=[
                {"tenant": "acme", "class": "assured", "floor": 10, "deadline_ms": 10_000},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 10_000},
            ],
        ) as guard:
            results = asyncio.run(_concurrently(guard.url, [BIG, BIG, SMALL, HUGE], 0.1))
    finally:
        stop(process)
    assert [r[0] for r in results[:3]] == [200, 200, 200]
    status, payload, headers, _ = results[3]
    assert (status, payload["error"]["code"]) == (429, "kv_excess")
    assert headers["x-should-retry"] == "false"
    events = list(read_jsonl(str(tmp_path / "decisions.jsonl")))
    huge = [e.kind for e in events if e.request_id == events_of(events, "acme")[-1]]
    assert EventKind.ENQUEUE not in huge and huge[-1] is EventKind.REJECT  # at once, unqueued
    starts = [e.request_id for e in events if e.kind is EventKind.DISPATCH]
    ends = {e.request_id: e.at for e in events if e.kind is EventKind.COMPLETE}
    dispatched = {e.request_id: e.at for e in events if e.kind is EventKind.DISPATCH}
    first, second, small = starts
    assert dispatched[second] >= ends[first]  # 48 + 48 > 64: it waited for room
    assert dispatched[small] >= dispatched[second]  # it would have fit, and did not overtake


VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",\
num_gpu_blocks_override="None",swap_space="4"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_the_kv_cache_vllm_reports_is_read_from_its_metrics():
    report = parse_backend_report(VLLM_METRICS)  # one block is vLLM's null block
    assert (report.kv_blocks, report.block_tokens, report.kv_tokens) == (2048, 16, 32_752)
    assert report.slots is None
    assert parse_backend_report("not { metrics").kv_tokens is None


@pytest.mark.parametrize(("declared", "starts"), [(64, True), (128, False)])
def test_a_kv_budget_beyond_what_the_backend_reports_refuses_to_start(tmp_path, declared, starts):
    """The emulator reports 4 blocks of 16 (vLLM's cache_config_info): a guard that would
    reserve 128 tokens there refuses to start, saying why; 64 starts."""
    backend, emulator = emulate(slots=2, kv_blocks=4)
    config = {**_config([backend], tmp_path / "decisions.jsonl")}
    config["backends"] = [{"url": backend, "slots": 2, "kv_tokens": declared}]
    config["port"] = 0
    path = tmp_path / "guard.yaml"
    path.write_text(yaml.safe_dump(config))
    with (tmp_path / "guard.err").open("wb") as err:
        process = floorguard("serve", "--config", str(path), stderr=err)
    try:
        if starts:
            listening(process)
        else:
            assert process.wait(30) == 2
            said = (tmp_path / "guard.err").read_text()
            assert "kv_tokens" in said and "the 64 KV tokens" in said, said
    finally:
        stop(process, emulator)
