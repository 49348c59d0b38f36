"""Every attack of docs/design.md §12 against a real `floorguard serve` process over loopback: an
authenticated but hostile tenant, a broken backend, a hostile network. After each, the
guard still serves an entitled request and its decision log passes `floorguard verify`
(every request one terminal outcome, every slot released once)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import openai
import orjson
import pytest

from floorguard.analysis.checker import check_trace
from floorguard.core.events import EventKind, read_jsonl
from tests.integration.backends import ScriptedBackend
from tests.integration.live import AUDIENCE, ISSUER, SECRET, Bearer, token
from tests.integration.processes import emulate, listening, serve, stop
from tests.redis_server import free_port

BEARER = Bearer("acme", "free")


def _config(urls: list[str], log: Path, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "window_s": 1.0,
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 50, "deadline_ms": 1820},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
        ],
        "backends": [{"url": url, "slots": 4} for url in urls],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": AUDIENCE},
        },
        "decision_log": str(log),
        "health_interval_s": 0.5,
    }  # fmt: skip
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


class Guard:
    def __init__(self, url: str, log: Path, admin_url: str | None = None) -> None:
        self.url = url
        self.log = log
        self.admin_url = admin_url

    def post(
        self,
        body: Any,
        tenant: str = "acme",
        path: str = "/v1/completions",
        headers: dict[str, str] | None = None,
        **kw: Any,
    ):
        sent = {**BEARER.get(tenant, {}), **(headers or {})}
        return asyncio.run(_post(self.url + path, body, sent, **kw))

    def status(self) -> dict[str, Any]:
        async def go():
            async with aiohttp.ClientSession() as s, s.get(self.url + "/admin/status") as r:
                return await r.json()

        return asyncio.run(go())


async def _post(url: str, body: Any, headers: dict[str, str], *, raw: bool = False):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=data, headers={**headers, "Content-Type": "application/json"}) as r,
    ):
        content = await r.read()
        payload = content if raw else orjson.loads(content) if content[:1] == b"{" else content
        return r.status, payload, r.headers, time.monotonic() - started


def dropped(log: Path) -> list[tuple[float, float, float]]:
    """Each request the guard dropped, from its decision log (the guard's clock): (when it
    arrived, when it was dropped, its deadline)."""
    events = list(read_jsonl(str(log)))
    arrived = {e.request_id: e for e in events if e.kind is EventKind.ARRIVE}
    return [
        (arrived[e.request_id].at, e.at, arrived[e.request_id].deadline_at or 0.0)
        for e in events
        if e.kind is EventKind.DROP
    ]


def dropped_at_doom(log: Path, n: int) -> None:
    """`n` requests dropped, each after it arrived and no later than its deadline: at its
    doom instant, not at once (`verify`, run on the log as the guard stops, holds every
    drop to DR: provably doomed when dropped) and not past its deadline."""
    drops = dropped(log)
    assert len(drops) == n, drops
    for arrived_at, at, deadline_at in drops:
        assert arrived_at < at <= deadline_at, (arrived_at, at, deadline_at)


@contextlib.contextmanager
def guard_process(
    tmp_path: Path, urls: list[str], *, max_files: int | None = None, **extra: Any
) -> Iterator[Guard]:
    """A `floorguard serve` process; on exit SIGTERM (it must exit 0) and `verify` its log.
    Its stderr goes to `guard.err` beside the log."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "decisions.jsonl"
    with (tmp_path / "guard.err").open("wb") as err:
        url, process = serve(
            _config(urls, log, **extra), tmp_path / "guard.yaml", err, max_files=max_files
        )
    try:
        yield Guard(url, log, (listening(process)[1:] or [None])[0])
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        stop(process)
    report = check_trace(list(read_jsonl(str(log))))
    assert report.ok(), report.violations[:3]


@pytest.fixture(scope="module")
def emulator():
    url, process = emulate()
    yield url
    stop(process)


@pytest.fixture(scope="module")
def scripted(live):
    backend = ScriptedBackend()
    url, _ = live.serve(backend.app)
    return backend, url


ENTITLED = {"model": "m", "prompt": "hi", "max_tokens": 4}


def _serves_entitled(guard: Guard) -> None:
    status, _, headers, _ = guard.post(ENTITLED)
    assert (status, headers["x-floorguard-decision"]) == (200, "entitled")


def test_deeply_nested_bodies_are_400_and_cannot_wedge_the_guard(tmp_path, emulator):
    """Four bodies nested 300 deep (orjson reads 1024 levels, writes 255) are refused before
    admission; no slot is taken, the entitled request after them is served."""
    deep = b'{"model":"m","prompt":"x","max_tokens":4,"metadata":' + b"[" * 300 + b"]" * 300 + b"}"
    with guard_process(tmp_path, [emulator], forward_priority=True) as guard:
        for _ in range(4):
            status, payload, headers, _ = guard.post(deep, tenant="free")
            assert (status, payload["error"]["code"]) == (400, "invalid_json")
            assert headers["Content-Type"].startswith("application/json")
        assert guard.status()["queues"]["in_flight"] == [0]
        _serves_entitled(guard)


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"max_tokens": 1, "min_tokens": 3000}, "invalid_min_tokens", "min_tokens"),
        ({"max_tokens": 1, "max_completion_tokens": 3000}, "conflicting_max_tokens",
         "max_completion_tokens"),
        ({"max_completion_tokens": 100_000}, "invalid_max_tokens", "max_completion_tokens"),
        ({"max_tokens": 4, "n": 4}, "unsupported_n", "n"),
        ({"max_tokens": 4, "best_of": 3}, "unsupported_n", "best_of"),
        ({"max_tokens": 4, "use_beam_search": True}, "unsupported_n", "use_beam_search"),
        ({"max_tokens": 4, "chat_template": "{{ 'x' * 10**6 }}"}, "costly_field",
         "chat_template"),
        ({"max_tokens": 4, "prompt": "x" * 900_000}, "prompt_too_long", "prompt"),
    ],
)  # fmt: skip
def test_work_beyond_what_is_metered_is_refused(tmp_path, scripted, body, code, param):
    """Every way to make the backend do more than the guard metered — more tokens than
    `max_tokens`, a larger second cap, several sequences, a client template, a prompt the
    meter would not see — is a 400 naming the field, and nothing reaches the backend."""
    backend, url = scripted
    backend.mode, before = "ok", len(backend.bodies)
    with guard_process(tmp_path, [url]) as guard:
        status, payload, headers, _ = guard.post({"model": "m", "prompt": "hi", **body})
        assert (status, payload["error"]["code"], payload["error"]["param"]) == (400, code, param)
        assert payload["error"]["type"] == "invalid_request_error"
        assert headers["x-should-retry"] == "false"
        assert len(backend.bodies) == before
        _serves_entitled(guard)


def test_the_forwarded_body_carries_the_metered_cap_and_no_client_priority(tmp_path, scripted):
    """A chat request with no cap is forwarded with the default cap the guard metered;
    `max_completion_tokens` is forwarded as ℓ; a client's `priority: -100` never reaches the
    backend, and with `forward_priority` the guard's own replaces it."""
    backend, url = scripted
    backend.mode = "ok"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "priority": -100}
    with guard_process(tmp_path / "a", [url]) as guard:
        assert guard.post(chat, tenant="free", path="/v1/chat/completions")[0] == 200
        assert (
            guard.post({**chat, "max_completion_tokens": 7}, path="/v1/chat/completions")[0] == 200
        )
        default, capped = backend.bodies[-2:]
        assert default["max_tokens"] == 16 and "priority" not in default
        assert capped["max_tokens"] == capped["max_completion_tokens"] == 7
    with guard_process(tmp_path / "b", [url], forward_priority=True) as guard:
        assert guard.post({**chat, "service_tier": "priority"}, tenant="free",
                          path="/v1/chat/completions")[0] == 200  # fmt: skip
        forwarded = backend.bodies[-1]
        assert forwarded["priority"] == 1 and "service_tier" not in forwarded


def test_the_gaie_objective_upstream_is_the_guards_never_the_clients(tmp_path, scripted):
    """Behind an Inference Extension pool: each class goes upstream as its configured
    InferenceObjective; an opportunistic tenant that sends the premium objective's header
    itself is still sent as sheddable (the guard forwards none of a client's headers)."""
    backend, url = scripted
    backend.mode = "ok"
    objectives = {"assured": "premium", "opportunistic": "sheddable"}
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    with guard_process(tmp_path, [url], upstream={"inference_objectives": objectives}) as guard:
        assert guard.post(body)[0] == 200
        assert (
            guard.post(body, tenant="free", headers={"x-gateway-inference-objective": "premium"})[0]
            == 200
        )
    assert backend.objectives[-2:] == ["premium", "sheddable"]


def test_a_cookie_one_tenants_reply_set_never_goes_upstream_for_another(tmp_path, scripted):
    """The guard's upstream session is shared by every tenant: a `Set-Cookie` on one
    tenant's reply (a backend's session, a load balancer's stickiness) must not be kept and
    sent on with the next tenant's request, nor reach the client, whose answer is the
    guard's."""
    backend, url = scripted
    backend.mode = "cookie"
    host_url = url.replace("127.0.0.1", "localhost")  # a cookie jar keeps no IP's cookies
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    try:
        with guard_process(tmp_path, [host_url]) as guard:
            first = guard.post(body)
            second = guard.post(body, tenant="free")
    finally:
        backend.mode = "ok"
    assert first[0] == second[0] == 200
    assert backend.cookies[-2:] == [None, None]
    assert "Set-Cookie" not in first[2] and "Set-Cookie" not in second[2]


def test_two_tenants_sharing_an_x_request_id_go_upstream_under_two_ids(tmp_path, scripted):
    """A backend may name its request by `x-request-id` (vLLM does): two tenants that send
    the same one go upstream under distinct ids, each the client's id and then the decision
    log's, while each client gets its own id back."""
    backend, url = scripted
    backend.mode = "ok"
    shared = {"x-request-id": "req-000001"}
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    with guard_process(tmp_path, [url]) as guard:
        answers = [guard.post(body, tenant=t, headers=shared) for t in ("acme", "free")]
    assert [(a[0], a[2]["x-request-id"]) for a in answers] == [(200, "req-000001")] * 2
    first, second = backend.request_ids[-2:]
    assert first != second
    assert first.startswith("req-000001.") and second.startswith("req-000001.")


def test_the_prompt_is_metered(tmp_path, scripted):
    """Under the token meter a long prompt costs its tenant what its length bounds: with a
    2,000-token floor, one 1,500-byte prompt is entitled and the next is not; both arrivals
    carry the counted prompt in the log."""
    backend, url = scripted
    backend.mode = "ok"
    contracts = [
        {
            "tenant": "acme",
            "class": "assured",
            "floor": 2000,
            "deadline_ms": 1820,
            "excess_policy": "reject",
        },
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
    ]
    with guard_process(
        tmp_path, [url], meter="token", contracts=contracts, window_s=3600.0
    ) as guard:
        long = {"model": "m", "prompt": "y" * 1500, "max_tokens": 4}
        assert guard.post(long)[2]["x-floorguard-decision"] == "entitled"
        status, payload, _, _ = guard.post(long)
        assert (status, payload["error"]["code"]) == (429, "floor_exhausted")
    arrivals = [
        e for e in read_jsonl(str(tmp_path / "decisions.jsonl")) if e.kind is EventKind.ARRIVE
    ]
    assert [e.num_prompt_tokens for e in arrivals] == [1502, 1502]
    assert [e.min_prompt_tokens for e in arrivals] == [0, 0]  # bounded, not counted: L uses 0


async def _raw_exchange(port: int, parts: list[bytes], pause_s: float = 0.2) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for part in parts:
        writer.write(part)
        await writer.drain()
        await asyncio.sleep(pause_s)
    data = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    return data


def test_a_body_sent_in_pieces_is_read_whole(tmp_path, emulator):
    """A body in two writes 0.2 s apart — by Content-Length, or chunked — is read to its end."""
    with guard_process(tmp_path, [emulator]) as guard:
        port = int(guard.url.rsplit(":", 1)[1])
        body = b'{"model":"m","prompt":"hi","max_tokens":2}'
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token('acme')}\r\nConnection: close\r\n"
        ).encode()
        by_length = head + f"Content-Length: {len(body)}\r\n\r\n".encode()
        reply = asyncio.run(_raw_exchange(port, [by_length + body[:17], body[17:]]))
        assert reply.startswith(b"HTTP/1.1 200")
        chunked = head + b"Transfer-Encoding: chunked\r\n\r\n"
        pieces = [b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:17], body[17:])]
        reply = asyncio.run(_raw_exchange(port, [chunked + pieces[0], pieces[1] + b"0\r\n\r\n"]))
        assert reply.startswith(b"HTTP/1.1 200")


async def _concurrently(url: str, bodies: list[tuple[str, dict[str, Any]]], stagger_s: float):
    async def one(n: int, tenant: str, body: dict[str, Any]):
        await asyncio.sleep(n * stagger_s)
        return await _post(url + "/v1/completions", body, BEARER[tenant])

    return await asyncio.gather(*(one(n, t, b) for n, (t, b) in enumerate(bodies)))


def test_doomed_requests_leave_the_queue_at_once_and_the_queue_is_bounded(tmp_path):
    """One slot held by a long request: queued requests are dropped as doomed the moment
    `now + L > D` (~1.6 s of their 1.82 s), not when the slot frees (~6 s), each told the
    largest `max_tokens` that would have fit; past the queue limit, 429 `queue_full`."""
    backend, process = emulate(slots=1)
    try:
        with guard_process(
            tmp_path,
            [backend],
            backends=[{"url": backend, "slots": 1}],
            contracts=[
                {"tenant": "acme", "class": "assured", "floor": 5, "deadline_ms": 1820},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 20_000},
            ],
            queue={"max_opportunistic": 2},
        ) as guard:
            hog = ("free", {"model": "m", "prompt": "x", "max_tokens": 400})
            small = ("acme", {"model": "m", "prompt": "x", "max_tokens": 16})
            waiting = ("free", {"model": "m", "prompt": "x", "max_tokens": 16})
            results = asyncio.run(
                _concurrently(guard.url, [hog, small, small, waiting, waiting, waiting], 0.05)
            )
    finally:
        stop(process)
    doomed = results[1:3]
    for status, payload, headers, _ in doomed:
        assert (status, payload["error"]["code"]) == (503, "doomed")
        assert payload["error"]["max_tokens_that_fit"] >= 0 and headers["Retry-After"]
    dropped_at_doom(tmp_path / "decisions.jsonl", 2)
    codes = sorted(r[0] for r in results[3:])
    assert codes == [200, 200, 429]
    assert next(r for r in results[3:] if r[0] == 429)[1]["error"]["code"] == "queue_full"


async def _stream_text(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=BEARER["acme"]) as r,
    ):
        return r.status, await r.read()


def test_a_stalled_stream_ends_with_an_sse_error_and_a_long_one_is_not_cut(tmp_path, scripted):
    """After the stream started, a backend that goes silent past `idle_timeout_s` ends it
    with the SSE error event — no second HTTP response inside the body; a stream longer than
    every timeout, but never silent for long, completes."""
    backend, url = scripted
    body = {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}
    upstream = {"idle_timeout_s": 0.5, "first_byte_timeout_s": 0.5}
    with guard_process(tmp_path, [url], upstream=upstream) as guard:
        backend.mode = "stall"
        status, text = asyncio.run(_stream_text(guard.url + "/v1/completions", body))
        assert status == 200 and b"HTTP/1.1" not in text
        assert text.rstrip().endswith(b'"code": "upstream_timeout", "param": null}}')
        backend.mode = "slow-stream"  # 2 s of chunks every 0.2 s
        status, text = asyncio.run(_stream_text(guard.url + "/v1/completions", body))
        assert status == 200 and text.rstrip().endswith(b"[DONE]") and text.count(b" tok") == 11
        backend.mode = "ok"
        _serves_entitled(guard)


def test_a_backend_error_redirect_or_huge_reply_never_reaches_the_client(tmp_path, scripted):
    """A 500 with internal text becomes a 502 without the text or the backend's address; a
    redirect is not followed; a reply over `max_response_bytes` is not relayed."""
    backend, url = scripted
    with guard_process(tmp_path, [url], limits={"max_response_bytes": 1_000_000}) as guard:
        backend.mode = "error"
        status, payload, _, _ = guard.post(ENTITLED)
        assert (status, payload["error"]["code"]) == (502, "upstream_error")
        assert b"secret" not in orjson.dumps(payload) and b"10.1.2.3" not in orjson.dumps(payload)
        assert url.rsplit(":", 1)[1].encode() not in orjson.dumps(payload)
        backend.mode = "redirect"
        status, payload, _, _ = guard.post(ENTITLED)
        assert (status, payload["error"]["upstream_status"]) == (502, 307)
        assert backend.hits.get("elsewhere", 0) == 0
        backend.mode = "big"
        status, payload, _, _ = guard.post(ENTITLED)
        assert (status, payload["error"]["code"]) == (502, "upstream_reply_too_large")
        backend.mode = "ok"
        _serves_entitled(guard)


def _header_config(trusted: list[str]) -> dict[str, Any]:
    return {"mode": "header", "header": "X-Tenant", "trusted_upstreams": trusted}


def test_header_identity_only_from_the_named_upstream_and_never_twice(tmp_path, emulator):
    """A tenant header from an address outside `trusted_upstreams` is 403 whatever it says;
    from the upstream it names the tenant; given twice it is refused."""

    async def send(url: str, headers: list[tuple[str, str]]):
        async with aiohttp.ClientSession() as s, s.post(url, json=ENTITLED, headers=headers) as r:
            return r.status, await r.json()

    with guard_process(tmp_path / "a", [emulator], identity=_header_config(["10.0.0.0/8"])) as g:
        status, payload = asyncio.run(send(g.url + "/v1/completions", [("X-Tenant", "acme")]))
        assert (status, payload["error"]["code"]) == (403, "untrusted_upstream")
    with guard_process(tmp_path / "b", [emulator], identity=_header_config(["127.0.0.1/32"])) as g:
        assert asyncio.run(send(g.url + "/v1/completions", [("X-Tenant", "acme")]))[0] == 200
        twice = [("X-Tenant", "free"), ("X-Tenant", "acme")]
        status, payload = asyncio.run(send(g.url + "/v1/completions", twice))
        assert (status, payload["error"]["code"]) == (400, "duplicate_identity")


def test_hostile_http_gets_json_answers(tmp_path, emulator):
    """An `exp` of 10^400 is 401; 404, 405 and the HTTP parser's own 400 are JSON in the
    OpenAI error shape; a connection that never finishes its headers is closed."""
    with guard_process(tmp_path, [emulator], header_timeout_s=1.0) as guard:
        forever = jwt.encode(
            {"sub": "acme", "iss": ISSUER, "aud": AUDIENCE, "exp": 10**400}, SECRET, "HS256"
        )
        status, payload, _, _ = asyncio.run(
            _post(guard.url + "/v1/completions", ENTITLED, {"Authorization": f"Bearer {forever}"})
        )
        assert (status, payload["error"]["code"]) == (401, "invalid_token")
        status, payload, _, _ = asyncio.run(_post(guard.url + "/nope", ENTITLED, {}))
        assert (status, payload["error"]["code"]) == (404, "not_found")

        async def get(path: str):
            async with aiohttp.ClientSession() as s, s.get(guard.url + path) as r:
                return r.status, await r.json()

        assert asyncio.run(get("/v1/completions")) == (
            405,
            {"error": {"message": "method not allowed on this path",
                       "type": "invalid_request_error", "code": "method_not_allowed",
                       "param": None}},
        )  # fmt: skip
        port = int(guard.url.rsplit(":", 1)[1])
        reply = asyncio.run(_raw_exchange(port, [b"GARBAGE \x00 NOT HTTP\r\n\r\n"]))
        assert reply.startswith(b"HTTP/1.0 400") and b'"code":"bad_http"' in reply
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as half_open:
            half_open.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            assert half_open.recv(1024) == b""  # closed by the guard, after header_timeout_s
        assert 0.5 < time.monotonic() - started < 5
        _serves_entitled(guard)


def test_admin_paths_need_the_token_or_their_own_listener(tmp_path, emulator):
    """With `admin.token`, /admin/status, /metrics and /admin/reload answer 401 without it and
    200 with it;
    with `admin.port`, they are not on the main listener at all."""
    admin_token = "an-admin-token-0123456789"

    async def get(url: str, headers: dict[str, str] | None = None):
        async with aiohttp.ClientSession() as s, s.get(url, headers=headers or {}) as r:
            return r.status

    async def reload(url: str, headers: dict[str, str] | None = None):
        async with aiohttp.ClientSession() as s, s.post(url, headers=headers or {}) as r:
            return r.status

    with guard_process(tmp_path / "a", [emulator], admin={"token": admin_token}) as guard:
        for given in (None, {"Authorization": "Bearer not-the-admin-token"}):  # no reload
            assert asyncio.run(reload(guard.url + "/admin/reload", given)) == 401
        assert (
            asyncio.run(
                reload(guard.url + "/admin/reload", {"Authorization": f"Bearer {admin_token}"})
            )
            == 200
        )
        for path in ("/admin/status", "/metrics"):
            assert asyncio.run(get(guard.url + path)) == 401
            assert (
                asyncio.run(get(guard.url + path, {"Authorization": f"Bearer {admin_token}"}))
                == 200
            )
    with guard_process(tmp_path / "b", [emulator], admin={"port": 0}) as guard:
        assert asyncio.run(get(guard.url + "/admin/status")) == 404
        assert asyncio.run(get(f"{guard.admin_url}/metrics")) == 200


def test_a_dead_backend_gets_no_requests(tmp_path, emulator):
    """Two backends, one dead: every request is served by the live one (none 502), the dead
    one is marked unhealthy in /admin/status."""
    dead = f"http://127.0.0.1:{free_port()}"
    with guard_process(tmp_path, [dead, emulator]) as guard:
        results = asyncio.run(
            _concurrently(guard.url, [("acme", ENTITLED)] * 6 + [("free", ENTITLED)] * 6, 0.02)
        )
        assert [r[0] for r in results] == [200] * 12
        assert guard.status()["queues"]["backends_healthy"] == [False, True]


def test_the_official_client_does_not_retry_a_refusal_into_three_arrivals(tmp_path, emulator):
    """The openai SDK retries 429s twice by default; a floor refusal says `x-should-retry:
    false`, so the refused call is one arrival in the log, not three."""
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": 1, "deadline_ms": 1820,
         "excess_policy": "reject"},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
    ]  # fmt: skip
    with guard_process(tmp_path, [emulator], contracts=contracts, window_s=3600.0) as guard:
        client = openai.OpenAI(base_url=guard.url + "/v1", api_key=token("acme"))
        client.completions.create(model="m", prompt="hi", max_tokens=2)
        with pytest.raises(openai.RateLimitError) as refused:
            client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert refused.value.code == "floor_exhausted"
    arrivals = [
        e for e in read_jsonl(str(tmp_path / "decisions.jsonl")) if e.kind is EventKind.ARRIVE
    ]
    assert len(arrivals) == 2


def test_backend_health_changes_are_logged_and_gauged(tmp_path, emulator):
    """Each backend's health change is one INFO line naming it, and /metrics has
    `floorguard_backend_up` per backend: 0 for the dead one, 1 for the live one."""
    dead = f"http://127.0.0.1:{free_port()}"

    async def scrape(url: str) -> str:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            return await r.text()

    with guard_process(tmp_path, [dead, emulator]) as guard:
        time.sleep(1.2)  # a few probes: the dead one stays down, logged never
        metrics = asyncio.run(scrape(guard.url))
    assert f'floorguard_backend_up{{backend="{dead}",model="default"}} 0.0' in metrics
    assert f'floorguard_backend_up{{backend="{emulator}",model="default"}} 1.0' in metrics
    err = (tmp_path / "guard.err").read_text()
    assert err.count(f"backend 1 ({emulator}/health) is up") == 1
    assert "backend 0" not in err  # never up: no change to log
