"""The edge's round-two attacks against a real `floorguard serve` on loopback: what takes the
floor away (a slow reader holding the slots) or reaches the backend unmetered. After each
the assured tenant is served on time and the decision log verifies (`guard_process`)."""

from __future__ import annotations

import asyncio
import io
import socket
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from floorguard.core.events import EventKind, read_jsonl
from tests.integration.live import token
from tests.integration.test_attacks import BEARER, ENTITLED, Guard, guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `scripted` backend fixture

DEADLINE_S = 1.82


def _hog(port: int, prompt: str, stream: bool = True) -> socket.socket:
    """A request whose client then reads nothing: its reply fills the socket buffers."""
    body = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream})
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token('free')}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


async def _assured_on_time(url: str, count: int) -> list[tuple[int, float]]:
    async def one(session: aiohttp.ClientSession) -> tuple[int, float]:
        started = time.monotonic()
        async with session.post(
            url + "/v1/completions", json=ENTITLED, headers=BEARER["acme"]
        ) as r:
            await r.read()
            return r.status, time.monotonic() - started

    async with aiohttp.ClientSession() as session:
        return await asyncio.gather(*(one(session) for _ in range(count)))


async def _flood_beside_assured(
    url: str, send: Any, count: int, lead_s: float
) -> tuple[list[int], list[tuple[int, float]]]:
    """`count` concurrent `send()` calls and, `lead_s` after they start, eight assured
    requests: (the flood's statuses, each assured request's (status, latency))."""
    flood = [asyncio.create_task(send()) for _ in range(count)]
    await asyncio.sleep(lead_s)
    assured = await _assured_on_time(url, 8)
    return list(await asyncio.gather(*flood)), assured


def _wait_idle(guard: Guard, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = guard.status()
        if sum(status["queues"]["in_flight"]) == 0 or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("prompt", "stream", "box_bytes", "outcome"),
    [
        ("huge:16", True, 1_000_000, "abort"),  # outgrows its box: cut, the backend aborted
        ("huge:12", True, 32_000_000, "complete"),  # fits: the backend finishes, the client lags
        ("huge:12", False, 1_000_000, "complete"),  # a whole reply, held while it is not read
    ],
)
def test_slow_readers_do_not_hold_the_slots(tmp_path, scripted, prompt, stream, box_bytes, outcome):
    """Four opportunistic requests (all of `C` = 4) whose clients read nothing: their slots
    are free within a second, eight assured requests after them are all on time, and the
    slow clients are cut at `client_write_timeout_s` (logged as their own reason)."""
    backend, url = scripted
    backend.mode = "ok"
    limits = {"max_buffered_reply_bytes": box_bytes}
    with guard_process(tmp_path, [url], limits=limits, client_write_timeout_s=2.0) as guard:
        port = int(guard.url.rsplit(":", 1)[1])
        hogs = [_hog(port, prompt, stream) for _ in range(4)]
        try:
            time.sleep(1.0)
            assert sum(_wait_idle(guard, 2.0)["queues"]["in_flight"]) == 0
            results = asyncio.run(_assured_on_time(guard.url, 8))
            assert [s for s, _ in results] == [200] * 8
            assert max(t for _, t in results) < DEADLINE_S
            time.sleep(3.0)  # past client_write_timeout_s: every hog has been cut
            assert guard.status()["replies"]["cut"] == 4
            assert guard.status()["replies"]["held_bytes"] == 0
        finally:
            for sock in hogs:
                sock.close()
    ends = [
        e
        for e in read_jsonl(str(tmp_path / "decisions.jsonl"))
        if e.tenant == "free" and e.kind in (EventKind.COMPLETE, EventKind.ABORT)
    ]
    assert [e.kind.value for e in ends] == [outcome] * 4
    if outcome == "abort":
        assert {e.reason for e in ends} == {"client_too_slow"}


def test_the_held_reply_bytes_are_bounded_across_requests(tmp_path, scripted):
    """Ten unread 6 MB non-streamed replies under a 20 MB bound for all held replies: the
    ones holding the most are cut (`reply_buffer_full`) until at most three are held — never
    more than the bound — and the assured tenant is served meanwhile."""
    backend, url = scripted
    backend.mode = "ok"
    limits = {"max_held_reply_bytes": 20_000_000}
    with guard_process(tmp_path, [url], limits=limits, client_write_timeout_s=30.0) as guard:
        port = int(guard.url.rsplit(":", 1)[1])
        hogs = []
        try:
            for _ in range(10):
                hogs.append(_hog(port, "huge:6", stream=False))
                time.sleep(0.2)
            deadline = time.monotonic() + 15.0  # until every reply has been read whole
            while (status := guard.status())["replies"]["cut"] < 7:
                assert status["replies"]["held_bytes"] <= 20_000_000
                assert time.monotonic() < deadline, status["replies"]
                time.sleep(0.2)
            assert status["replies"]["held_bytes"] <= 20_000_000  # at most 3 of 6 MB
            results = asyncio.run(_assured_on_time(guard.url, 8))
            assert [s for s, _ in results] == [200] * 8
        finally:
            for sock in hogs:
                sock.close()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"chat_template_kwargs": {"documents": [{"text": "d" * 750_000}]}}, "prompt_too_long",
         "messages"),
        ({"chat_template_kwargs": {"chat_template": "{{ 'x' * 10**6 }}"}}, "costly_field",
         "chat_template_kwargs"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "s", "schema": {"d": "x" * 900_000}}}},
         "field_too_large", "response_format"),
        ({"guided_grammar": " | ".join(f'"a{i}"' for i in range(20_000))}, "field_too_large",
         "guided_grammar"),
        ({"guided_choice": [f"c{i}" for i in range(20_000)]}, "field_too_large", "guided_choice"),
        ({"stop": [f"s{i}" for i in range(10_000)]}, "field_too_large", "stop"),
        ({"stop_token_ids": list(range(50_000))}, "field_too_large", "stop_token_ids"),
        ({"logit_bias": {str(i): 1 for i in range(70_000)}}, "field_too_large", "logit_bias"),
        ({"allowed_token_ids": list(range(100_000))}, "field_too_large", "allowed_token_ids"),
        ({"bad_words": [f"w{i}" for i in range(10_000)]}, "field_too_large", "bad_words"),
        ({"prompt_logprobs": 20}, "costly_field", "prompt_logprobs"),
        ({"logprobs": True, "top_logprobs": 20}, "field_too_large", "top_logprobs"),
    ],
)  # fmt: skip
def test_work_the_meter_does_not_see_never_reaches_the_backend(
    tmp_path, scripted, extra, code, param
):
    """Each unmetered field (docs/http.md, What the guard rewrites), sent by an
    opportunistic tenant to a real guard (limits.max_body_bytes raised so the body itself is
    admitted): a 400 naming the field, not retryable, and nothing forwarded."""
    backend, url = scripted
    backend.mode, before = "ok", len(backend.bodies)
    with guard_process(tmp_path, [url], limits={"max_body_bytes": 4_000_000}) as guard:
        status, payload, headers, _ = guard.post(
            {**CHAT, **extra}, tenant="free", path="/v1/chat/completions"
        )
        assert (status, payload["error"]["code"], payload["error"]["param"]) == (400, code, param)
        assert headers["x-should-retry"] == "false"
        assert len(backend.bodies) == before
        status, _, headers, elapsed = guard.post(ENTITLED)
        assert (status, headers["x-floorguard-decision"]) == (200, "entitled")
        assert elapsed < DEADLINE_S


def test_unauthenticated_model_listings_share_nothing_admitted_work_needs(tmp_path, scripted):
    """200 concurrent unauthenticated `GET /v1/models` against a backend that takes 2 s to
    list: they are answered from one fetch (not 200 through the dispatch connector), and
    the assured tenant's eight requests meanwhile are all on time."""
    backend, url = scripted
    backend.mode, backend.models_delay_s = "ok", 2.0
    hits = backend.hits.get("models", 0)

    async def attack(guard_url: str):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def listing() -> int:
                async with session.get(guard_url + "/v1/models") as r:
                    await r.read()
                    return r.status

            return await _flood_beside_assured(guard_url, listing, 200, 0.3)

    try:
        with guard_process(tmp_path, [url]) as guard:
            listed, assured = asyncio.run(attack(guard.url))
    finally:
        backend.models_delay_s = 0.0
    assert listed == [200] * 200
    assert backend.hits["models"] - hits == 1
    assert [s for s, _ in assured] == [200] * 8 and max(t for _, t in assured) < DEADLINE_S


def test_idle_connections_cannot_use_up_the_descriptors(tmp_path, scripted):
    """Under a 1,024-descriptor limit (a container's default), 1,100 idle connections: the
    guard caps client connections below the limit and closes the oldest idle ones for new
    ones, so the assured tenant's eight requests are all on time; the cap is said once, and
    no accept fails with "Too many open files"."""
    backend, url = scripted
    backend.mode = "ok"
    idle: list[socket.socket] = []
    with guard_process(tmp_path, [url], max_files=1024, header_timeout_s=60.0) as guard:
        port = int(guard.url.rsplit(":", 1)[1])
        try:
            for _ in range(1100):
                idle.append(socket.create_connection(("127.0.0.1", port)))
            time.sleep(0.5)
            results = asyncio.run(_assured_on_time(guard.url, 8))
        finally:
            for sock in idle:
                sock.close()
    assert [s for s, _ in results] == [200] * 8 and max(t for _, t in results) < DEADLINE_S
    err = (tmp_path / "guard.err").read_text()
    assert "Too many open files" not in err
    assert err.count("client connections at the cap") == 1


def test_a_backend_4xx_is_relayed_as_that_4xx_and_not_retried(tmp_path, scripted):
    """A backend's 404 for a mistyped model reaches the official client as a 404 with the
    backend's message and `x-should-retry: false`: one call is one admission, not three."""
    backend, url = scripted
    backend.mode = "reject"
    try:
        with guard_process(tmp_path, [url]) as guard:
            client = openai.OpenAI(base_url=guard.url + "/v1", api_key=token("acme"))
            with pytest.raises(openai.NotFoundError) as refused:
                client.completions.create(model="mx", prompt="hi", max_tokens=2)
            assert refused.value.code == "upstream_rejected"
            assert "does not exist" in refused.value.message
    finally:
        backend.mode = "ok"
    arrivals = [
        e for e in read_jsonl(str(tmp_path / "decisions.jsonl")) if e.kind is EventKind.ARRIVE
    ]
    assert len(arrivals) == 1


def _raw(port: int, data: bytes) -> bytes:
    """One raw exchange: what the guard answers, up to the end of its first response."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
            head, _, body = reply.partition(b"\r\n\r\n")
            length = next(
                (int(h.split(b":")[1]) for h in head.split(b"\r\n")
                 if h.lower().startswith(b"content-length:")),
                None,
            )  # fmt: skip
            if length is not None and len(body) >= length:
                break
        return reply


def test_hostile_framing_gets_clear_answers(tmp_path, scripted):
    """A body marked gzip that is not gzip is a 400 (not a 500 with a traceback); an
    oversized `Expect: 100-continue` is a 413 with no 100 Continue before it; an HTTP/0.9
    request line is a 505 in HTTP/1.1, not an `HTTP/0.9 200`."""
    backend, url = scripted
    backend.mode = "ok"
    with guard_process(tmp_path, [url]) as guard:
        port = int(guard.url.rsplit(":", 1)[1])
        status, payload, _, _ = guard.post(
            b"this is not gzip at all", headers={"Content-Encoding": "gzip"}
        )
        assert (status, payload["error"]["code"]) == (400, "bad_content_encoding")
        reply = _raw(
            port,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 50000000\r\n\r\n",
        )
        assert reply.startswith(b"HTTP/1.1 413") and b"100 Continue" not in reply
        reply = _raw(port, b"GET /v1/models\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 505") and b'"code":"http_version"' in reply
        _serves_entitled_on_time(guard)
    assert "Traceback" not in (tmp_path / "guard.err").read_text()


def _serves_entitled_on_time(guard: Guard) -> None:
    status, _, headers, elapsed = guard.post(ENTITLED)
    assert (status, headers["x-floorguard-decision"]) == (200, "entitled")
    assert elapsed < DEADLINE_S


def test_the_documented_headers_are_present_and_the_access_log_is_true(tmp_path, scripted):
    """A surplus answer names the window it arrived in (docs/design.md §17); a 429 names the
    class; an admitted stream whose client left is logged with its admission and outcome
    `abort`, not as `refused`; a 900 KB `model` is clipped in the access log."""
    backend, url = scripted
    backend.mode = "ok"
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": 1, "deadline_ms": 1820,
         "excess_policy": "reject"},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
    ]  # fmt: skip
    access = tmp_path / "access.jsonl"
    with guard_process(
        tmp_path,
        [url],
        contracts=contracts,
        window_s=3600.0,
        access_log=str(access),
        limits={"max_body_bytes": 2_000_000},
    ) as guard:
        _, _, headers, _ = guard.post(ENTITLED, tenant="free")
        assert headers["x-floorguard-decision"] == "surplus"
        assert headers["x-floorguard-window"].isdigit()
        guard.post(ENTITLED)
        status, _, headers, _ = guard.post(ENTITLED)
        assert status == 429 and headers["x-floorguard-class"] == "assured"
        assert headers["x-floorguard-window"].isdigit()
        port = int(guard.url.rsplit(":", 1)[1])
        hog = _hog(port, "huge:16")  # an admitted stream whose client then leaves
        time.sleep(0.5)
        hog.close()
        time.sleep(0.5)
        guard.post({**ENTITLED, "model": "m" * 900_000}, tenant="free")
    lines = [orjson.loads(line) for line in access.read_text().splitlines()]
    left = next(line for line in lines if line["status"] == 499)
    assert (left["decision"], left["outcome"]) == ("surplus", "abort")
    assert max(len(line.get("model") or "") for line in lines) <= 200


def test_one_tenants_refused_large_bodies_do_not_delay_anothers_arrivals(tmp_path, scripted):
    """A hundred 1 MB bodies of 20,000 messages each from the opportunistic tenant, refused
    (`prompt_too_long`), sent beside the assured tenant's eight: they are counted off the
    event loop, one at a time for that tenant, so every assured request is entitled and on
    time (counted on the event loop, as it once was, the assured requests took ≈ 2.1 s
    here: late)."""
    backend, url = scripted
    backend.mode = "ok"
    messages = [{"role": "user", "content": "x" * 40}] * 20_000
    big = orjson.dumps({"model": "m", "messages": messages, "max_tokens": 4})
    assert len(big) > 900_000

    async def attack(guard_url: str):
        async with aiohttp.ClientSession() as session:

            async def refused() -> int:
                async with session.post(
                    guard_url + "/v1/chat/completions",
                    data=io.BytesIO(big),
                    headers={**BEARER["free"], "Content-Type": "application/json"},
                ) as r:
                    await r.read()
                    return r.status

            return await _flood_beside_assured(guard_url, refused, 100, 0.05)

    with guard_process(tmp_path, [url], limits={"max_body_bytes": 2_000_000}) as guard:
        statuses, assured = asyncio.run(attack(guard.url))
    assert statuses == [400] * 100
    assert [s for s, _ in assured] == [200] * 8 and max(t for _, t in assured) < DEADLINE_S
    admitted = [
        e for e in read_jsonl(str(tmp_path / "decisions.jsonl"))
        if e.kind is EventKind.ADMIT and e.tenant == "acme"
    ]  # fmt: skip
    assert len(admitted) == 8 and all(e.entitled for e in admitted)


@pytest.mark.parametrize("half_close", ["refuse", "serve"])
def test_a_half_closed_client_gets_an_answer(tmp_path, scripted, half_close):
    """A client that sends a whole request and then closes its sending side (shutdown
    SHUT_WR) is answered, not dropped in silence: by default a 400 `half_closed` at once and
    the request aborted (its slot freed), with `half_close: serve` the whole answer."""
    backend, url = scripted
    backend.mode = "slow-stream"  # two seconds of stream: the FIN comes long before the end
    body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True})
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token('acme')}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    try:
        config = {} if half_close == "refuse" else {"half_close": half_close}  # the default
        with guard_process(tmp_path, [url], **config) as guard:
            port = int(guard.url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(request)
                sock.shutdown(socket.SHUT_WR)
                started, reply = time.monotonic(), b""
                while chunk := sock.recv(65536):
                    reply += chunk
                elapsed = time.monotonic() - started
            assert sum(_wait_idle(guard)["queues"]["in_flight"]) == 0
            backend.mode = "ok"
            _serves_entitled_on_time(guard)
    finally:
        backend.mode = "ok"
    ends = [
        e
        for e in read_jsonl(str(tmp_path / "decisions.jsonl"))
        if e.kind in (EventKind.COMPLETE, EventKind.ABORT)
    ]
    if half_close == "refuse":
        assert reply.startswith(b"HTTP/1.1 400") and b'"code":"half_closed"' in reply
        assert elapsed < 1.0
        # aborted once it had arrived, or answered before its handler ran (never arrived)
        assert [e.kind for e in ends] in (
            [EventKind.ABORT, EventKind.COMPLETE],
            [EventKind.COMPLETE],
        )
    else:
        assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"data: ") == 12, reply[-300:]
        assert b"data: [DONE]" in reply and reply.endswith(b"\r\n0\r\n\r\n") and elapsed > 1.5
        assert [e.kind for e in ends] == [EventKind.COMPLETE, EventKind.COMPLETE]
