"""The edge's round-three attacks against a real `floorguard serve` on loopback: prompt the
meter did not see (a chat role, a suffix beside token ids), bills that vanished, the ends of
a drain, a backend's garbage reply, and the lows of the admin API, tracing and headers.
After each the decision log verifies (`guard_process`)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import aiohttp
import orjson
import pytest

from floorguard.core.events import EventKind, read_jsonl
from tests.integration.test_attacks import BEARER, guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `scripted` and `emulator` fixtures

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("body", "path", "code"),
    [
        ({"messages": [{"role": "r" * 20_000, "content": "hi"}]}, CHAT, "invalid_role"),
        ({"messages": [{"role": "r" * 20_000, "content": "x"}] * 40}, CHAT, "invalid_role"),
        ({"messages": [{"role": "user", "content": "hi", "name": "n" * 20_000}]}, CHAT,
         "prompt_too_long"),
        ({"prompt": [1, 2, 3], "suffix": "s" * 20_000}, "/v1/completions", "prompt_too_long"),
    ],
    ids=["huge-role", "forty-roles", "huge-name", "suffix-beside-ids"],
)  # fmt: skip
def test_prompt_hidden_where_the_meter_did_not_look_is_refused(tmp_path, scripted, body, path,
                                                               code):  # fmt: skip
    """A 20,000-byte role was metered as 19 tokens and forty of them as 448 (vLLM renders
    ≈ 800,000); a token-id prompt's 20,000-byte suffix as 3. Each is refused before the
    backend (a role outside `limits.chat_roles`, or a prompt counted past
    `max_prompt_tokens` = 4,096 here), and with the KV budget on (1,024 tokens) the
    assured tenant is served on time after."""
    backend, url = scripted
    backend.mode, before = "ok", len(backend.bodies)
    budgeted = [{"url": url, "slots": 4, "kv_tokens": 1024}]
    with guard_process(
        tmp_path, [url], backends=budgeted, limits={"max_prompt_tokens": 4096}
    ) as guard:
        status, payload, _, _ = guard.post({"model": "m", "max_tokens": 4, **body}, "free", path)
        assert (status, payload["error"]["code"]) == (400, code)
        assert len(backend.bodies) == before
        status, _, headers, elapsed = guard.post(
            {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            path=CHAT,
        )
        assert (status, headers["x-floorguard-decision"]) == (200, "entitled")
        assert elapsed < 1.82


def _access_lines(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


async def _read_some_and_leave(url: str, chunks: int) -> int:
    """A 64-token stream whose client reads `chunks` events and closes: the events read."""
    body = {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True}
    seen = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body, headers=BEARER["free"]) as r,
    ):
        assert r.status == 200
        async for line in r.content:
            seen += line.startswith(b"data:")
            if seen == chunks:
                break
    return seen


def test_a_stream_closed_before_its_usage_is_billed_what_was_read(tmp_path, emulator):
    """A stream closed after 48 of 64 tokens was billed nothing. It is billed the metered
    prompt and the events the guard read from the backend (at least the 48 relayed), marked
    `estimated: cut` in the access log, in `/metrics` and in `floorguard usage`."""
    access = tmp_path / "access.jsonl"
    with guard_process(tmp_path, [emulator], access_log=str(access)) as guard:
        read = asyncio.run(_read_some_and_leave(guard.url, 48))
        time.sleep(0.5)  # the guard ends the request when the client has gone
        with urllib.request.urlopen(guard.url + "/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    assert read == 48
    (line,) = [x for x in _access_lines(access) if x.get("tenant") == "free"]
    usage = line["usage"]
    assert usage["estimated"] == "cut"
    assert 48 <= usage["completion_tokens"] <= 64
    assert usage["prompt_tokens"] == len(b"hi") + 2  # as metered (no tokenizer)
    assert re.search(r'floorguard_usage_estimated_total\{[^}]*why="cut"[^}]*\} 1\.0', metrics)
    report = subprocess.run(
        [sys.executable, "-m", "floorguard", "usage", str(access), "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (row,) = json.loads(report.stdout)
    assert (row["estimated"], row["reported"]) == (1, 0)
    assert row["completion_tokens"] == usage["completion_tokens"]


def test_a_backend_that_omits_usage_is_billed_an_estimate_and_warned_about(tmp_path, scripted):
    """A backend whose streams carry no usage event was billed 0 with no warning: each such
    stream is billed its events read (`estimated: unreported`) and the guard says, once,
    which pool's backend omits usage."""
    backend, url = scripted
    backend.mode = "ok"  # its streams: two token events and [DONE], never a usage event
    access = tmp_path / "access.jsonl"
    with guard_process(tmp_path, [url], access_log=str(access)) as guard:
        for _ in range(2):
            status, _, _, _ = guard.post(
                {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}, "free", raw=True
            )
            assert status == 200
    lines = [x for x in _access_lines(access) if x.get("tenant") == "free"]
    assert [x["usage"]["estimated"] for x in lines] == ["unreported"] * 2
    assert all(x["usage"]["completion_tokens"] >= 2 for x in lines)
    warnings = (tmp_path / "guard.err").read_text().count("finished a reply without usage")
    assert warnings == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_backends_garbage_200_is_a_502_and_a_fail(tmp_path, scripted, stream):
    """A backend's 200 whose body is not its endpoint's reply (an HTML page, a stream that
    is no SSE) was passed on as a 200 and logged `complete`: it is a 502 `upstream_malformed`
    to the client and a `fail` in the decision log."""
    backend, url = scripted
    backend.mode = "garbage"
    try:
        with guard_process(tmp_path, [url]) as guard:
            status, payload, _, _ = guard.post(
                {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": stream}, "free"
            )
            assert (status, payload["error"]["code"]) == (502, "upstream_malformed")
    finally:
        backend.mode = "ok"
    (end,) = [
        e for e in read_jsonl(str(tmp_path / "decisions.jsonl"))
        if e.kind in (EventKind.COMPLETE, EventKind.FAIL, EventKind.ABORT)
    ]  # fmt: skip
    assert (end.kind, end.reason) == (EventKind.FAIL, "upstream_malformed")


async def _admin(url: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url + path, headers=headers, data=b"x") as r,
    ):
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize(
    ("method", "path", "headers", "code"),
    [
        ("POST", "/admin/reload", {"Origin": "http://evil.example", "Content-Type": "text/plain"},
         "admin_cross_site"),
        ("POST", "/admin/reload", {"Origin": "null", "Content-Type": "text/plain"},
         "admin_cross_site"),
        ("GET", "/admin/status", {"Host": "rebound.example:80"}, "admin_host_not_allowed"),
        ("POST", "/admin/reload", {"Host": "rebound.example"}, "admin_host_not_allowed"),
    ],
    ids=["csrf", "csrf-null-origin", "rebinding-status", "rebinding-reload"],
)  # fmt: skip
def test_the_tokenless_admin_api_refuses_other_sites(tmp_path, scripted, method, path, headers,
                                                     code):  # fmt: skip
    """With the default admin mode (no token, loopback only) a cross-site
    `POST /admin/reload` as `text/plain` was executed (CSRF) and a rebound `Host` was
    answered. Both are 403 naming why, nothing is reloaded, and a plain loopback call
    still works."""
    _, url = scripted
    with guard_process(tmp_path, [url]) as guard:
        status, payload = asyncio.run(_admin(guard.url, method, path, headers))
        assert (status, payload["error"]["code"]) == (403, code)
        status, payload = asyncio.run(_admin(guard.url, "GET", "/admin/status", {}))
        assert status == 200 and "queues" in payload
    assert "reload" not in (tmp_path / "guard.err").read_text()


@pytest.mark.parametrize(
    "query",
    ["authorization=Bearer%20{jwt}", "x-api-key={jwt}", "X_Auth_Token=abc", "q={jwt}"],
    ids=["authorization", "x-api-key", "auth-token", "jwt-under-any-name"],
)
def test_a_key_under_a_query_name_the_guard_did_not_list_is_refused(tmp_path, scripted, query):
    """A key under `?authorization=`, `?x-api-key=` … was accepted silently (it
    never authenticated, but a key in a URL is a leak). Any query name that may hold a
    credential, and a JWT under any name, is a 400 `credentials_in_url`."""
    backend, url = scripted
    backend.mode, before = "ok", len(backend.bodies)
    jwt = BEARER["free"]["Authorization"].removeprefix("Bearer ")
    with guard_process(tmp_path, [url]) as guard:
        status, payload, _, _ = guard.post(
            {"model": "m", "prompt": "hi", "max_tokens": 4}, "free",
            "/v1/completions?" + query.format(jwt=jwt),
        )  # fmt: skip
        assert (status, payload["error"]["code"]) == (400, "credentials_in_url")
    assert len(backend.bodies) == before


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traceparent_w3c_forbids_is_not_forwarded(tmp_path, scripted):
    """A `traceparent` of version `ff` was forwarded (W3C forbids it). It is
    dropped, as is a version-00 one with fields after its four; a later version's first
    four fields are forwarded as version 00."""
    backend, url = scripted
    backend.mode = "ok"
    sent = [f"ff-{TRACE}", f"00-{TRACE}-extra", f"01-{TRACE}-extra", f"00-{TRACE}"]
    with guard_process(tmp_path, [url]) as guard:
        for parent in sent:
            body = {"model": "m", "prompt": "hi", "max_tokens": 4}
            assert guard.post(body, headers={"traceparent": parent})[0] == 200
    assert [t for t, _ in backend.traces[-4:]] == [None, None, f"00-{TRACE}", f"00-{TRACE}"]


def test_a_clients_sampled_flag_cannot_force_spans_past_the_ceiling(tmp_path, scripted, live):
    """With `sample_ratio: 0`, a client's sampled flag forced a span on every
    request (600 requests: 224 KB of spans). `client_sample_ratio` caps it: at 0 none of
    40 sampled requests makes a span; at 0.5 about half do."""
    from tests.integration.test_tracing import Receiver  # noqa: PLC0415

    backend, url = scripted
    backend.mode = "ok"
    counts = {}
    for ceiling in (0.0, 0.5):
        receiver = Receiver()
        endpoint, _ = live.serve(receiver.app)
        tracing = {"otlp_endpoint": endpoint + "/v1/traces", "sample_ratio": 0.0,
                   "client_sample_ratio": ceiling}  # fmt: skip
        with guard_process(tmp_path / str(ceiling), [url], tracing=tracing) as guard:
            for _ in range(40):
                body = {"model": "m", "prompt": "hi", "max_tokens": 4}
                assert guard.post(body, "free", headers={"traceparent": f"00-{TRACE}"})[0] == 200
        counts[ceiling] = sum(s.name == "floorguard.request" for s in receiver.spans)
    assert counts[0.0] == 0
    assert 8 <= counts[0.5] <= 32  # binomial(40, 0.5): outside this once in 10⁴ runs


def test_log_lines_hold_for_any_line_splitter(tmp_path, scripted):
    """U+2028 in a model name split an access-log line for readers that use
    `splitlines`. Every line of both logs is one line to `splitlines` and decodes to the
    same model name."""
    backend, url = scripted
    backend.mode = "ok"
    access = tmp_path / "access.jsonl"
    model = "m\u2028injected\u2029x\x85y"
    with guard_process(tmp_path, [url], access_log=str(access)) as guard:
        assert guard.post({"model": model, "prompt": "hi", "max_tokens": 4}, "free")[0] == 200
    for path in (access, tmp_path / "decisions.jsonl"):
        text = path.read_text(encoding="utf-8")
        assert text.splitlines() == text.split("\n")[:-1], path.name
    (line,) = [orjson.loads(x) for x in access.read_text().splitlines() if "free" in x]
    assert line["model"] == model
