"""Floors in first-token terms (docs/design.md §19) on a real `floorguard serve` in front of
an emulated backend (ada-fp8's timing, C = 4), with the official `openai` client streaming:
a tenant floods the slots with long decodes, and the chat floor's first tokens come within
its TTFT only where the guard keeps slots for it. The access log has each reply's TTFT and
TPOT, `/metrics` the floor's TTFT attainment, and `verify` judges the log (a late first
token outside the region is reported, conditional; none is a violation)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request

import openai
import orjson
import pytest

from floorguard.profiles import get_profile
from tests.integration.live import token
from tests.integration.processes import floorguard, listening, stop
from tests.integration.test_attacks import guard_process

PROFILE = "ada-fp8"
TTFT_MS = 600
FLOOD_TOKENS = 256
"""ada-fp8's ceiling for 256 tokens is ≈ 2.4 s: longer than the 1 s window, so no reserved
slot is lent to the flood, and every flood request holds its slot for seconds."""


@pytest.fixture(scope="module")
def ada_emulator():
    process = floorguard("emulate", "--profile", PROFILE, "--slots", "4", "--port", "0")
    yield listening(process)[0]
    stop(process)


def _metric(metrics: str, name: str, tenant: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{") and f'tenant="{tenant}"' in line
    )


def _flood(url: str, n: int, done: list) -> None:
    with openai.OpenAI(base_url=url + "/v1", api_key=token("free"), max_retries=0) as free:
        for chunk in free.completions.create(
            model="m", prompt="x", max_tokens=FLOOD_TOKENS, stream=True
        ):
            del chunk
    done.append(n)


@pytest.mark.parametrize("reserved", [2, 0])
def test_the_floors_first_tokens_under_a_flood_of_long_decodes(tmp_path, ada_emulator, reserved):
    assert get_profile(PROFILE).ceiling.at(FLOOD_TOKENS) > 1.0
    access = tmp_path / "access.jsonl"
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": 2, "ttft_ms": TTFT_MS, "tpot_ms": 100},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 60_000},
    ]
    with guard_process(
        tmp_path,
        [ada_emulator],
        contracts=contracts,
        profile=PROFILE,
        reserved_slots=reserved,
        access_log=str(access),
    ) as guard:
        done: list[int] = []
        flood = [
            threading.Thread(target=_flood, args=(guard.url, n, done), daemon=True)
            for n in range(6)
        ]
        for thread in flood:
            thread.start()
        time.sleep(0.5)  # the flood holds its slots (all four without a reservation)
        ttfts = []
        with openai.OpenAI(base_url=guard.url + "/v1", api_key=token("acme"), max_retries=0) as c:
            for _ in range(4):  # two a window: the floor's B
                started = time.monotonic()
                try:
                    stream = c.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=16, stream=True,
                    )  # fmt: skip
                    first = None
                    for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.monotonic() - started
                except openai.APIStatusError as refused:  # dropped: its first token was doomed
                    assert refused.status_code == 503 and "by its TTFT" in refused.message
                    first = float("inf")
                ttfts.append(first)
                time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
        for thread in flood:
            thread.join(60)
        assert sorted(done) == list(range(6))
        with urllib.request.urlopen(guard.url + "/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    ended = _metric(metrics, "floorguard_floor_ttft_requests_total", "acme")
    met = _metric(metrics, "floorguard_floor_ttft_met_total", "acme")
    assert ended == 4
    lines = [orjson.loads(line) for line in access.read_text().splitlines()]
    chat = [line for line in lines if line.get("tenant") == "acme"]
    served = [line for line in chat if line["outcome"] == "complete"]
    assert len(chat) == 4 and all(line["tpot_ms"] > 0 and line["ttft_ms"] > 0 for line in served)
    verify = subprocess.run(
        [sys.executable, "-m", "floorguard", "verify", str(guard.log), "--json"],
        capture_output=True,
        check=False,
    )
    report = json.loads(verify.stdout)
    assert report["ok"], report["violations"][:3]  # no TTFT violation either way
    late = sum(t > TTFT_MS / 1e3 for t in ttfts)
    if reserved:
        # inside §19's region: every first token in time, by the client's clock and the guard's
        assert late == 0 and met == 4 and report["num_ttft_late"] == 0, (ttfts, report)
        assert len(served) == 4
    else:
        # the flood holds all four slots for seconds: the floor waits one out, as vLLM would,
        # and a first token the doom gate proves late is dropped while it waits (DR)
        assert late >= 1 and met < 4, (ttfts, metrics)
        dropped = report["outcomes"].get("drop", 0)
        assert report["num_ttft_late"] + dropped >= 1
        assert {v["prop"] for v in report["conditional"]} <= {"TTFT"}
