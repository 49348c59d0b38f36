"""SIGTERM drains as docs/http.md says, against a real `floorguard serve` under
load: it keeps listening, answers every new request 503 `draining` (`Connection: close`),
`/readyz` 503 at once, lets in-flight work finish, and cuts a stream still running at the
deadline with the SSE error event, logged as cut and counted truly in the stop line."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import orjson

from floorguard.analysis.checker import check_trace
from floorguard.core.events import EventKind, read_jsonl
from tests.integration.processes import emulate, serve, stop
from tests.integration.test_attacks import BEARER, _config


async def _during_the_drain(url: str, process) -> dict:
    async with aiohttp.ClientSession() as session:

        async def post(body: dict, tenant: str = "acme"):
            async with session.post(
                url + "/v1/completions", json=body, headers=BEARER[tenant]
            ) as r:
                return r.status, dict(r.headers), await r.read()

        long = asyncio.create_task(
            post({"model": "m", "prompt": "x", "max_tokens": 400, "stream": True})
        )
        short = asyncio.create_task(post({"model": "m", "prompt": "x", "max_tokens": 40}))
        await asyncio.sleep(0.3)  # both in flight
        process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.1)
        after = [await post({"model": "m", "prompt": "x", "max_tokens": 2}) for _ in range(5)]
        async with session.get(url + "/readyz") as r:
            ready = r.status
        return {"long": await long, "short": await short, "after": after, "ready": ready}


def test_sigterm_drains_under_load(tmp_path):
    backend, emulator = emulate()
    log, access = tmp_path / "decisions.jsonl", tmp_path / "access.jsonl"
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": 50, "deadline_ms": 20_000},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 20_000},
    ]  # a 400-token stream (≈ 6 s here) fits its deadline and outlasts the drain
    config = _config(
        [backend], log, contracts=contracts, drain_timeout_s=1.5, access_log=str(access)
    )
    with (tmp_path / "guard.err").open("wb") as err:
        url, process = serve(config, tmp_path / "guard.yaml", err)
    try:
        out = asyncio.run(_during_the_drain(url, process))
        assert process.wait(30) == 0
    finally:
        stop(process, emulator)
    for status, headers, body in out["after"]:  # no connection refused, no reset
        assert status == 503 and orjson.loads(body)["error"]["code"] == "draining"
        assert headers["Connection"] == "close" and headers["Retry-After"]
    assert out["ready"] == 503
    assert out["short"][0] == 200, out["short"][2]
    status, _, text = out["long"]
    assert status == 200 and b'"code": "drain_deadline"' in text.rstrip().splitlines()[-1]
    ended = {e.reason for e in read_jsonl(str(log)) if e.kind is EventKind.ABORT}
    assert ended == {"drain_deadline"}
    report = check_trace(list(read_jsonl(str(log))))
    assert report.ok(), report.violations[:3]
    lines = [orjson.loads(line) for line in access.read_text().splitlines()]
    cut = [line for line in lines if line.get("reason") == "drain_deadline"]
    assert len(cut) == 1 and cut[0]["outcome"] == "abort" and cut[0]["decision"] == "entitled"
    err = (tmp_path / "guard.err").read_text()
    assert "1 request(s) cut at the drain deadline" in err
    assert sum(1 for line in lines if line["status"] == 503) == 5


async def _at_the_deadline(url: str, process, streams: int, queued: int) -> dict:
    """`streams` long streams fill the slots and `queued` whole requests wait behind them;
    SIGTERM, then SIGHUP twice during the drain; everything is read to its end."""
    async with aiohttp.ClientSession() as session:

        async def post(body: dict):
            async with session.post(
                url + "/v1/completions", json=body, headers=BEARER["acme"]
            ) as r:
                return r.status, await r.read()

        running = [
            asyncio.create_task(
                post({"model": "m", "prompt": "x", "max_tokens": 400, "stream": True})
            )
            for _ in range(streams)
        ]
        await asyncio.sleep(0.5)  # every slot taken
        waiting = [
            asyncio.create_task(post({"model": "m", "prompt": "x", "max_tokens": 40}))
            for _ in range(queued)
        ]
        await asyncio.sleep(0.3)  # queued behind them
        process.send_signal(signal.SIGTERM)
        for _ in range(2):
            await asyncio.sleep(0.3)
            process.send_signal(signal.SIGHUP)
        return {
            "streams": await asyncio.gather(*running),
            "queued": await asyncio.gather(*waiting),
        }


def test_the_drain_deadline_answers_every_request_and_sighup_cannot_kill_it(tmp_path):
    """At the drain deadline a queued request got zero bytes (logged 499), some
    streams ended with no SSE error event, and a SIGHUP during the drain killed the guard.
    Here 16 streams hold every slot and 12 requests queue behind them: each queued one is
    answered 503 `draining`, every stream ends with the `drain_deadline` error event, the
    SIGHUPs are logged and ignored, the guard exits 0 and its log verifies."""
    backend, emulator = emulate(slots=16)
    log = tmp_path / "decisions.jsonl"
    contracts = [{"tenant": "acme", "class": "assured", "floor": 100, "deadline_ms": 60_000}]
    config = _config([backend], log, contracts=contracts, drain_timeout_s=1.5)
    config["backends"] = [{"url": backend, "slots": 16}]
    with (tmp_path / "guard.err").open("wb") as err:
        url, process = serve(config, tmp_path / "guard.yaml", err)
    try:
        out = asyncio.run(_at_the_deadline(url, process, streams=16, queued=12))
        assert process.wait(30) == 0
    finally:
        stop(process, emulator)
    for status, body in out["queued"]:
        assert (status, orjson.loads(body)["error"]["code"]) == (503, "draining")
    for status, text in out["streams"]:
        assert status == 200 and b'"code": "drain_deadline"' in text.rstrip().splitlines()[-1]
    err = (tmp_path / "guard.err").read_text()
    assert err.count("SIGHUP ignored") == 2
    ended = [e for e in read_jsonl(str(log)) if e.kind is EventKind.ABORT]
    assert len(ended) == 28 and {e.reason for e in ended} == {"drain_deadline"}
    report = check_trace(list(read_jsonl(str(log))))
    assert report.ok(), report.violations[:3]
