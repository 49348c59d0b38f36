"""design §17 through a real `floorguard serve` over the emulator: a surplus request that the
doom gate's envelope proves cannot start in time is refused on arrival, 429 `busy`, with a
constant `Retry-After` (when the slot frees is another tenant's business: docs/design.md §17) and
no `x-should-retry: false` (a retry may help) — not held until its doom instant. With
`queue.refuse_busy: false` the same request waits out ~1.6 s of its 1.82 s and is dropped,
a retryable 429 `doomed` (the guard was busy; the floor did not fail). The decision log
verifies either way."""

from __future__ import annotations

import asyncio

import pytest

from floorguard.core.events import EventKind, read_jsonl
from tests.integration.processes import emulate, stop
from tests.integration.test_attacks import _concurrently, dropped_at_doom, guard_process

HOG = ("acme", {"model": "m", "prompt": "x", "max_tokens": 400})  # holds the slot ≥ 5.4 s
SHORT = ("free", {"model": "m", "prompt": "x", "max_tokens": 16})  # doomed 1.56 s after arrival


@pytest.mark.parametrize("refuse_busy", [True, False])
def test_a_request_that_cannot_start_in_time_is_refused_at_once(tmp_path, refuse_busy):
    backend, process = emulate(slots=1)
    try:
        with guard_process(
            tmp_path,
            [backend],
            backends=[{"url": backend, "slots": 1}],
            contracts=[
                {"tenant": "acme", "class": "assured", "floor": 5, "deadline_ms": 20_000},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
            ],
            queue={"refuse_busy": refuse_busy},
        ) as guard:
            hog, short = asyncio.run(_concurrently(guard.url, [HOG, SHORT], 0.2))
    finally:
        stop(process)
    assert hog[0] == 200
    status, payload, headers, _ = short
    assert headers["x-floorguard-class"] == "opportunistic"
    assert "x-should-retry" not in headers  # the SDK's automatic retry may take it
    if refuse_busy:
        assert (status, payload["error"]["code"]) == (429, "busy")
        assert payload["error"]["type"] == "rate_limit_error"
        # at once, in its arrival's decision: never queued to wait for its doom instant
        events = [e for e in read_jsonl(str(tmp_path / "decisions.jsonl")) if e.tenant == "free"]
        assert [e.kind for e in events] == [EventKind.ARRIVE, EventKind.PROPOSE, EventKind.REJECT]
        assert headers["Retry-After"] == "1"  # not when the hog's slot frees (4–7 s here)
    else:
        assert (status, payload["error"]["code"]) == (429, "doomed")
        assert payload["error"]["type"] == "rate_limit_error"
        assert headers["x-floorguard-decision"] == "dropped"
        dropped_at_doom(tmp_path / "decisions.jsonl", 1)
