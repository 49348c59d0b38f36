"""Usage metering (docs/design.md §17) on a real `floorguard serve` over the emulator, with the
official `openai` SDK: what the backend reported each reply cost — a JSON reply's `usage`,
a stream's usage event the guard asked for (and took out of the stream of a client that did
not ask) — is in the access log, in `/metrics` per tenant, model and class, and in
`floorguard usage`; the decision log verifies afterwards (`guard_process`)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import openai
import orjson

from tests.integration.live import token
from tests.integration.test_attacks import guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `emulator` backend fixture

CHAT = [{"role": "user", "content": "count the tokens"}]


def _tokens(metrics: str, tenant: str, kind: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("floorguard_tokens_total{"):
            labels, value = line.rsplit(" ", 1)
            if f'tenant="{tenant}"' in labels and f'kind="{kind}"' in labels:
                total += float(value)
    return total


def test_what_the_backend_reports_is_logged_counted_and_reported(tmp_path, emulator):
    access = tmp_path / "access.jsonl"
    with guard_process(tmp_path, [emulator], access_log=str(access)) as guard:
        with (
            openai.OpenAI(base_url=guard.url + "/v1", api_key=token("acme"), max_retries=0) as acme,
            openai.OpenAI(base_url=guard.url + "/v1", api_key=token("free"), max_retries=0) as free,
        ):
            whole = acme.chat.completions.create(model="m", messages=CHAT, max_tokens=5)
            unasked = list(
                acme.chat.completions.create(model="m", messages=CHAT, max_tokens=6, stream=True)
            )
            asked = list(
                acme.chat.completions.create(
                    model="m",
                    messages=CHAT,
                    max_tokens=7,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            other = free.completions.create(model="m", prompt="hi", max_tokens=3)
        with urllib.request.urlopen(guard.url + "/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    # the client that did not ask sees no usage event; the one that asked does
    assert all(chunk.usage is None and chunk.choices for chunk in unasked)
    assert asked[-1].usage is not None and asked[-1].choices == []
    assert whole.usage.completion_tokens == 5 and asked[-1].usage.completion_tokens == 7
    lines = [orjson.loads(line) for line in access.read_text().splitlines()]
    by_cap = {line["max_tokens"]: line["usage"] for line in lines}
    assert by_cap[5] == {"prompt_tokens": whole.usage.prompt_tokens, "completion_tokens": 5}
    assert by_cap[6]["completion_tokens"] == 6  # counted though the client never saw it
    assert by_cap[6]["prompt_tokens"] == whole.usage.prompt_tokens  # the same prompt
    assert by_cap[7] == {"prompt_tokens": asked[-1].usage.prompt_tokens, "completion_tokens": 7}
    assert by_cap[3]["completion_tokens"] == other.usage.completion_tokens == 3
    assert _tokens(metrics, "acme", "completion") == 5 + 6 + 7
    assert _tokens(metrics, "acme", "prompt") == sum(by_cap[n]["prompt_tokens"] for n in (5, 6, 7))
    assert _tokens(metrics, "free", "completion") == 3
    report = subprocess.run(
        [sys.executable, "-m", "floorguard", "usage", str(access), "--by", "tenant", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {row["tenant"]: row for row in json.loads(report.stdout)}
    assert rows["acme"]["completion_tokens"] == 18 and rows["acme"]["reported"] == 3
    assert rows["free"]["completion_tokens"] == 3
