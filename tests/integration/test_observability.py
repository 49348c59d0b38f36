"""What an operator reads about a real `floorguard serve` process: one access-log line per
request (refusals before admission included), `x-request-id` kept (or replaced when it is
not a plain id) and sent upstream, the decision log rotated by size and verified across its
segments, and what it says when it drains and stops."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import aiohttp
import orjson
import pytest

from floorguard.proxy.observe.decision_log import rotated_segments
from tests.integration.backends import ScriptedBackend
from tests.integration.live import AUDIENCE, ISSUER, SECRET, token
from tests.integration.processes import serve, stop


@pytest.fixture(scope="module")
def scripted(live):
    backend = ScriptedBackend()
    url, _ = live.serve(backend.app)
    return backend, url


def _config(backend: str, log, access) -> dict:
    return {
        "window_s": 1.0,
        "contracts": [
            {"tenant": "acme", "class": "assured", "floor": 2, "deadline_ms": 1820},
            {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
        ],
        "backends": [{"url": backend, "slots": 4}],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["HS256"], "secret": SECRET, "issuer": ISSUER,
                    "audience": AUDIENCE},
        },
        "decision_log": str(log),
        "decision_log_rotate": {"max_mb": 0.004},  # ~4 KB: a few dozen requests a segment
        "access_log": str(access),
    }  # fmt: skip


async def _post(session, url, headers, body):
    async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status, r.headers.get("x-request-id")


def test_access_log_request_ids_rotation_and_shutdown(tmp_path, scripted):
    backend, backend_url = scripted
    backend.mode = "ok"
    log, access, stderr_path = tmp_path / "d.jsonl", tmp_path / "access.jsonl", tmp_path / "err"
    with stderr_path.open("wb") as stderr:
        url, guard = serve(_config(backend_url, log, access), tmp_path / "g.yaml", stderr=stderr)
        try:
            acme = {"Authorization": f"Bearer {token('acme')}"}
            body = {"model": "m", "prompt": "hi", "max_tokens": 2}

            async def traffic():
                async with aiohttp.ClientSession() as s:
                    kept = await _post(s, url, {**acme, "x-request-id": "trace-abc.123"}, body)
                    hostile = await _post(
                        s, url, {**acme, "x-request-id": 'x"\\n' + "y" * 300}, body
                    )
                    unauthenticated = await _post(s, url, {}, body)
                    bad = await _post(s, url, acme, {"model": "m", "max_tokens": 0, "prompt": "x"})
                    free = {"Authorization": f"Bearer {token('free')}"}
                    for _ in range(3):  # three batches of the log, each past 4 KB
                        await asyncio.gather(*(_post(s, url, free, body) for _ in range(20)))
                        await asyncio.sleep(0.5)
                    return kept, hostile, unauthenticated, bad

            kept, hostile, unauthenticated, bad = asyncio.run(traffic())
            guard.send_signal(signal.SIGTERM)
            assert guard.wait(30) == 0
        finally:
            stop(guard)

    assert kept == (200, "trace-abc.123")
    assert hostile[0] == 200 and len(hostile[1]) == 32
    # upstream: the client's id (or the fresh one), then the decision log's (unique)
    assert any(sent.startswith(hostile[1] + ".") for sent in backend.request_ids)
    assert unauthenticated[0] == 401 and unauthenticated[1]
    assert bad[0] == 400 and bad[1]

    segments = rotated_segments(access)  # the access log rotates with the decision log
    assert len(segments) > 1
    lines = [json.loads(line) for part in segments for line in part.read_text().splitlines()]
    assert len(lines) == 4 + 60  # one per request, refused before admission included
    by_id = {line["request_id"]: line for line in lines}
    first = by_id["trace-abc.123"]
    assert f"trace-abc.123.{first['id']}" in backend.request_ids
    assert first["tenant"] == "acme" and first["class"] == "assured"
    assert (first["decision"], first["status"], first["outcome"]) == ("entitled", 200, "complete")
    assert first["max_tokens"] == 2 and first["total_ms"] >= first["service_ms"] > 0
    assert by_id[unauthenticated[1]]["status"] == 401
    assert by_id[unauthenticated[1]]["decision"] == "refused"
    assert "tenant" not in by_id[unauthenticated[1]]
    assert by_id[bad[1]]["reason"] == "invalid_max_tokens"
    statuses = {line["status"] for line in lines if line.get("tenant") == "free"}
    assert statuses <= {200, 429} and 200 in statuses

    segments = rotated_segments(log)
    assert len(segments) >= 3, segments  # rotated by size, the live file last
    for segment in segments:  # rotated at batch boundaries: whole lines only
        assert all(orjson.loads(line) for line in segment.read_text().splitlines())
    assert all(segment.stat().st_size > 0 for segment in segments[:-1])
    verify = [sys.executable, "-m", "floorguard", "verify"]
    whole = subprocess.run(
        [*verify, str(log), "--rotated", "--json"], capture_output=True, check=False
    )
    assert whole.returncode == 0, whole.stderr
    report = json.loads(whole.stdout)
    assert report["ok"] and report["num_requests"] == 2 + 60  # admitted or refused by it
    alone = subprocess.run([*verify, str(segments[1])], capture_output=True, text=True, check=False)
    assert alone.returncode != 0 and "--rotated" in alone.stderr + alone.stdout

    said = stderr_path.read_text()
    assert "draining: new requests get 503" in said
    assert "stopped: answered {'2xx': " in said and "'4xx': " in said


def test_json_logs_are_one_object_a_line_never_wrapped(tmp_path, scripted):
    """`log_format: json`: everything `serve` writes to stderr — its backend's probe, its
    drain, its shutdown — is one JSON object a line, however long the message (the
    shutdown line names a 200-character log path; text through rich wrapped at 80 columns
    off a terminal); where it listens is still found in its stdout (`listening`)."""
    _, backend = scripted
    log = tmp_path / ("decisions-" + "x" * 190 + ".jsonl")
    config = _config(backend, log, tmp_path / "a.jsonl")
    config["log_format"] = "json"
    with (tmp_path / "guard.err").open("wb") as err:
        url, process = serve(config, tmp_path / "guard.yaml", err)
    try:
        headers = {"Authorization": f"Bearer {token('acme')}"}

        async def go():
            async with aiohttp.ClientSession() as session:
                return await _post(session, url, headers, {"model": "m", "prompt": "x"})

        assert asyncio.run(go())[0] == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    lines = (tmp_path / "guard.err").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line: one object
    assert all({"t", "level", "logger", "message"} <= set(r) for r in records)
    stopped = [r for r in records if r["message"].startswith("stopped:")]
    assert len(stopped) == 1 and str(log) in stopped[0]["message"]
