"""Models and pools (`models:`) against a real `floorguard serve` process and two real
emulator processes, each serving its own model name (a wrong name is a 404 there, as from
vLLM). The attacks: a tenant asking for a model it has no contract for, a model nobody
serves, a flood on one model while another model's floor is used, one pool's backend
dying. Each pool keeps its own floor and slots, and the decision log (two pools, one file)
passes the checker pool by pool."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import openai
import orjson
from prometheus_client.parser import text_string_to_metric_families

from floorguard.analysis.checker import check_trace
from floorguard.core.events import EventKind, read_jsonl
from tests.integration.live import AUDIENCE, ISSUER, SECRET, token
from tests.integration.processes import emulate, serve, stop

DEADLINE_MS = 1820


def _config(llama: str, qwen: str, log: str) -> dict:
    return {
        "window_s": 3600.0,  # one window for the whole test, its middle now: no edge in it
        "origin_at": time.time() - 1800,
        "models": {
            "llama": {"backends": [{"url": llama, "slots": 2}]},
            "qwen": {"backends": [{"url": qwen, "slots": 2}]},
        },
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 6, "deadline_ms": DEADLINE_MS,
             "models": ["llama"]},
            {"tenant": "beta", "class": "assured", "floor": 2, "deadline_ms": DEADLINE_MS,
             "models": ["qwen"]},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": DEADLINE_MS},
        ],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": AUDIENCE},
        },
        "decision_log": log,
        "health_interval_s": 0.3,
        "health_failures_to_down": 1,
    }  # fmt: skip


def _client(url: str, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token(tenant), max_retries=0)


async def _post(session, url, tenant, model, max_tokens=4):
    started = time.monotonic()
    body = {"model": model, "prompt": "hi", "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {token(tenant)}"}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
        payload = orjson.loads(await r.read())
        return r.status, r.headers.get("x-floorguard-decision"), payload, time.monotonic() - started


def test_each_model_is_its_own_pool_with_its_own_floor(tmp_path):
    llama, llama_process = emulate(slots=2, model="llama")
    qwen, qwen_process = emulate(slots=2, model="qwen")
    log = tmp_path / "decisions.jsonl"
    url, guard = serve(_config(llama, qwen, str(log)), tmp_path / "guard.yaml")
    try:
        client = _client(url, "acme")
        assert [m.id for m in client.models.list().data] == ["llama", "qwen"]
        assert client.completions.create(model="llama", prompt="hi", max_tokens=2).usage

        # a model nobody serves, and none at all: 404 in the OpenAI shape
        try:
            client.completions.create(model="mistral", prompt="hi", max_tokens=2)
            raise AssertionError("a model nobody serves was served")
        except openai.NotFoundError as exc:
            assert exc.body["code"] == "model_not_found" and exc.body["param"] == "model"

        async def nameless():
            async with aiohttp.ClientSession() as session:
                headers = {"Authorization": f"Bearer {token('acme')}"}
                body = {"prompt": "hi", "max_tokens": 2}
                async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
                    return r.status, orjson.loads(await r.read())

        status, payload = asyncio.run(nameless())
        assert (status, payload["error"]["code"]) == (404, "model_not_found")
        # a tenant on a model its contract does not cover: 403
        try:
            client.completions.create(model="qwen", prompt="hi", max_tokens=2)
            raise AssertionError("acme was served on qwen without a contract there")
        except openai.PermissionDeniedError as exc:
            assert exc.body["code"] == "no_contract_for_model"

        async def flood_and_floor():
            async with aiohttp.ClientSession() as session:
                await _post(session, url, "acme", "llama")  # warm: 2 of acme's 6 taken
                flood = [
                    asyncio.create_task(_post(session, url, "free", "qwen", max_tokens=30))
                    for _ in range(30)
                ]
                await asyncio.sleep(0.2)
                floor = await asyncio.gather(
                    *(_post(session, url, "acme", "llama") for _ in range(3))
                )
                beta = await _post(session, url, "beta", "qwen")
                return floor, beta, await asyncio.gather(*flood)

        floor, beta, flood = asyncio.run(flood_and_floor())
        # the qwen flood does not touch llama's slots or acme's floor there
        assert [(s, d) for s, d, _, _ in floor] == [(200, "entitled")] * 3
        assert max(t for *_, t in floor) * 1e3 < DEADLINE_MS
        # on qwen, beta's floor goes ahead of the opportunistic flood queued there
        assert beta[:2] == (200, "entitled") and beta[3] * 1e3 < DEADLINE_MS
        assert {s for s, *_ in flood} <= {200, 429, 503}

        async def metrics_and_status():
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
                async with s.get(url + "/admin/status") as r:
                    return text, await r.json()

        text, status = asyncio.run(metrics_and_status())
        models = {
            sample.labels.get("model")
            for family in text_string_to_metric_families(text)
            if family.name == "floorguard_admitted"
            for sample in family.samples
        }
        assert models == {"llama", "qwen"}
        assert set(status["pools"]) == {"llama", "qwen"}
        assert status["pools"]["llama"]["queues"]["slots"] == [2]
        assert set(status["pools"]["qwen"]["window"]["credits_left"]) == {"beta"}

        # qwen's only backend dies: qwen answers 503, llama goes on, the guard stays ready
        stop(qwen_process)
        time.sleep(1.0)

        async def after():
            async with aiohttp.ClientSession() as session:
                down = await _post(session, url, "free", "qwen")
                up = await _post(session, url, "acme", "llama")
                async with session.get(url + "/readyz") as r:
                    return down, up, r.status, await r.json()

        down, up, ready, body = asyncio.run(after())
        assert (down[0], down[2]["error"]["code"]) == (503, "no_healthy_backend")
        assert up[0] == 200
        assert ready == 200
        assert {b["model"]: b["healthy"] for b in body["backends"]} == {
            "llama": True,
            "qwen": False,
        }
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(30) == 0
    finally:
        stop(guard, llama_process, qwen_process)
    events = list(read_jsonl(str(log)))
    assert {e.pool for e in events} == {"llama", "qwen"}
    assert sum(e.kind is EventKind.CONFIG for e in events) == 2
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
    assert report.num_entitled >= 3 + 1
