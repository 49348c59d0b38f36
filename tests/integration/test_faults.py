"""The fault matrix: each fault ends every request in exactly one terminal outcome (the
decision log verifies), and the guard keeps serving afterwards.

Backend refusing connections and client disconnect mid-stream are in test_proxy.py."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest

from floorguard.analysis.checker import check_fleet, check_trace
from floorguard.core.events import EventKind, read_jsonl
from floorguard.proxy.config.guard import BackendSpec
from floorguard.proxy.process.app import SERVER
from tests.integration.live import Bearer, guard_config
from tests.integration.processes import emulate, serve, stop
from tests.redis_server import RedisServer

BEARER = Bearer("acme", "free")


def body(tokens=4, stream=False):
    return {"model": "m", "prompt": "x", "max_tokens": tokens, "stream": stream}


async def _post(url, tenant="acme", tokens=4):
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body(tokens), headers=BEARER[tenant]) as r,
    ):
        return r.status, await r.json(content_type=None)


async def _stream(url, tokens, *, on_first=None, read_delay_s=0.0):
    """Stream a completion; returns (status, the SSE data lines)."""
    lines = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/v1/completions", json=body(tokens, stream=True), headers=BEARER["acme"]
        ) as r,
    ):
        async for line in r.content:
            if line.startswith(b"data: "):
                lines.append(line[6:].strip())
                if len(lines) == 1 and on_first is not None:
                    on_first()
                await asyncio.sleep(read_delay_s)
        return r.status, lines


def _verified(live, app, log):
    live.flush_log(app)
    events = list(read_jsonl(str(log)))
    report = check_trace(events)
    assert report.ok(), report.violations[:3]
    return events


def test_backend_crash_mid_stream_fails_that_request_and_the_guard_keeps_serving(live, tmp_path):
    backend, emulator = emulate()
    log = tmp_path / "crash.jsonl"
    url, app = live.guard(guard_config(backend, decision_log=str(log)))
    try:
        status, lines = live.run(_stream(url, 100, on_first=emulator.kill))
    finally:
        stop(emulator)
    assert status == 200
    assert b"[DONE]" not in lines
    assert b"upstream_broke_mid_stream" in lines[-1]  # the client is told, in the stream
    assert app[SERVER].guard.num_in_flight == 0
    assert live.run(_post(url))[0] == 502  # gone: unreachable, no other backend: 502 at once
    events = _verified(live, app, log)
    failed = next(e for e in events if e.kind is EventKind.FAIL)
    assert failed.reason == "upstream_broke_mid_stream"


async def _failing_backend(how: str):
    """Answers its health probe; fails every completion before the first byte of a reply:
    `503` (an overloaded server's answer) or `drop` (the connection closed unanswered)."""

    async def serve(reader, writer):
        request_line = await reader.readline()
        if request_line.startswith(b"GET /health"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        elif how == "503":
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("how", ["503", "drop"])
def test_a_backend_that_fails_before_its_first_byte_is_retried_on_another(live, tmp_path, how):
    """Two backends, one failing every request before the first byte of its reply (a 503,
    or its connection closed unanswered): each request that lands there goes, once, to the
    other and is served — a `requeue` in the log, one admission (one credit) a request,
    the failing backend marked down until its probe answers — and the log verifies.
    Before, each was a 502."""
    server, bad = live.run(_failing_backend(how))
    log = tmp_path / "retry.jsonl"
    config = guard_config(bad, floor=8, window_s=3600.0, decision_log=str(log))
    backends = [{"url": bad, "slots": 4}, {"url": live.emulator(), "slots": 4}]
    config = config.model_copy(update={"backends": [BackendSpec(**b) for b in backends]})
    url, app = live.guard(config)
    try:
        deadline = time.monotonic() + 10
        while not all(app[SERVER].pool.health.healthy):  # both answer their probes
            assert time.monotonic() < deadline
            time.sleep(0.05)
        statuses = [live.run(_post(url)) for _ in range(6)]
    finally:
        server.close()
    assert [s for s, _ in statuses] == [200] * 6
    events = _verified(live, app, log)
    assert [e.kind for e in events].count(EventKind.REQUEUE) >= 1
    dispatched = [e.backend for e in events if e.kind is EventKind.DISPATCH]
    assert 0 in dispatched and dispatched.count(1) == 6  # each served once, on the good one
    admitted = [e for e in events if e.kind is EventKind.ADMIT]
    assert len(admitted) == 6  # one admission (one charge) a request


async def _hanging_backend():
    """Answers its health probe, reads a completion request and never answers it."""
    held = []

    async def hold(reader, writer):
        request_line = await reader.readline()
        if request_line.startswith(b"GET /health"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()
            return
        held.append(writer)  # keep the connection open; answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, held, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _gather(*coroutines):
    return await asyncio.gather(*coroutines)


def test_a_hanging_backend_is_504_after_the_upstream_timeout(live, tmp_path):
    server, held, backend = live.run(_hanging_backend())
    log = tmp_path / "hang.jsonl"
    url, app = live.guard(
        guard_config(backend, decision_log=str(log), upstream={"first_byte_timeout_s": 0.5})
    )
    started = time.monotonic()
    results = live.run(_gather(*(_post(url) for _ in range(3))))
    assert [status for status, _ in results] == [504] * 3
    assert all(payload["error"]["code"] == "upstream_timeout" for _, payload in results)
    assert time.monotonic() - started < 5
    assert app[SERVER].guard.num_in_flight == 0
    live.run(_close(server, held))
    _verified(live, app, log)


async def _close(server, held):
    for writer in held:
        writer.close()
    server.close()


def test_a_slow_client_gets_its_whole_stream_and_others_are_served_meanwhile(live, tmp_path):
    log = tmp_path / "slow.jsonl"
    url, app = live.guard(guard_config(live.emulator(), decision_log=str(log)))

    async def both():
        slow = asyncio.create_task(_stream(url, 30, read_delay_s=0.05))
        await asyncio.sleep(0.2)
        fast = await _post(url, "acme", 4)
        return await slow, fast

    (status, lines), fast = live.run(both())
    assert status == 200 and lines[-1] == b"[DONE]" and len(lines) == 31
    assert fast[0] == 200
    _verified(live, app, log)


def test_redis_killed_and_restarted_mid_run(live, tmp_path):
    redis_server = RedisServer().start()
    log = tmp_path / "redis.jsonl"
    config = guard_config(
        live.emulator(),
        floor=2,
        window_s=2.0,
        decision_log=str(log),
        store={"url": redis_server.url, "replicas": 1, "timeout_ms": 100, "retry_s": 0.3},
        excess_policy="reject",  # refused from the floor: not served as spare surplus
    )
    url, app = live.guard(config)
    server = app[SERVER]
    try:
        time.sleep(2.0 - time.time() % 2.0 + 0.05)  # start just after a window begins
        assert live.run(_post(url))[0] == 200
        redis_server.kill()
        outcomes = [live.run(_post(url))[0] for _ in range(3)]
        assert outcomes == [429] * 3  # fail-static: nothing more in the window Redis was lost
        assert server.shared_floor.degraded
        time.sleep(2.0 - time.time() % 2.0 + 0.05)  # the next window: ⌊B/N⌋ = 2 local
        assert live.run(_post(url))[0] == 200
        redis_server.start()
        time.sleep(0.4)  # past retry_s
        assert live.run(_post(url))[0] in (200, 429)
        assert not server.shared_floor.degraded
        # back, and held down for retry_s and a window while other replicas may still
        # grant from their fail-static shares (docs/replicas.md, "Recovering")
        assert server.status()["store"]["state"] == "recovering"
    finally:
        redis_server.close()
    live.flush_log(app)
    report = check_fleet([list(read_jsonl(str(log)))])
    # AF is conditional on the shared store: the three refusals made while Redis was away
    # (in the window it was lost in) are the documented fail-static under-granting, which
    # the log marks (`store` events) and `verify` reports apart; every request has one
    # outcome.
    assert report.ok(), report.violations
    assert sum("store fail-static" in v.message for v in report.conditional) == 3
    # Redis came back empty: the window it lost its state in is closed to fresh takes, so
    # a refusal there (if the last request fell in it) is conditional too
    assert len(report.conditional) <= 4
    assert report.degraded_s[0] > 0
    assert report.num_requests == sum(report.counts.values()) == 6


def test_sigterm_drains_in_flight_requests_and_exits_0(tmp_path):
    backend, emulator = emulate()
    log = tmp_path / "drain.jsonl"
    config = guard_config(backend, decision_log=str(log)).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    url, guard = serve(config, tmp_path / "guard.yaml")
    try:
        status, lines = asyncio.run(
            _stream(url, 60, on_first=lambda: guard.send_signal(signal.SIGTERM))
        )
        assert status == 200 and lines[-1] == b"[DONE]" and len(lines) == 61  # it finished
        assert guard.wait(20) == 0
        with pytest.raises(aiohttp.ClientError):
            asyncio.run(_post(url))  # nothing listens any more
    finally:
        stop(guard, emulator)
    events = list(read_jsonl(str(log)))
    assert check_trace(events).ok()
    assert [e.kind for e in events].count(EventKind.COMPLETE) == 1


def test_a_draining_guard_answers_503_and_is_not_ready(live):
    url, app = live.guard(guard_config(live.emulator()))
    app[SERVER].draining = True
    status, payload = live.run(_post(url))
    assert (status, payload["error"]["code"]) == (503, "draining")

    async def readyz():
        async with aiohttp.ClientSession() as s, s.get(url + "/readyz") as r:
            return r.status

    assert live.run(readyz()) == 503
