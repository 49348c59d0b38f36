"""The KV budget (SPEC §16) through a real `floorguard serve` over the emulator: a backend
with 64 KV tokens takes a 48-token request and holds the next one back until it ends — a
small surplus request that would fit does not overtake it — and a request no backend can
hold is refused at once, 429 `kv_excess`, no retry. The decision log passes `verify`, whose
MEMORY check holds the starts to the budget."""

from __future__ import annotations

import asyncio

from floorguard.core.events import EventKind, read_jsonl
from tests.integration.processes import emulate, stop
from tests.integration.test_attacks import _concurrently, guard_process

BIG = ("acme", {"model": "m", "prompt": "x", "max_tokens": 40})  # 3 + 40 → 48 reserved
SMALL = ("free", {"model": "m", "prompt": "x", "max_tokens": 8})  # 3 + 8 → 16 reserved
HUGE = ("acme", {"model": "m", "prompt": "x", "max_tokens": 100})  # 112 > 64: never fits


def test_a_backend_takes_what_its_kv_cache_holds_and_refuses_what_it_never_could(tmp_path):
    backend, process = emulate(slots=4)
    try:
        with guard_process(
            tmp_path,
            [backend],
            backends=[{"url": backend, "slots": 4, "kv_tokens": 64}],
            contracts=[
                {"tenant": "acme", "class": "assured", "floor": 10, "deadline_ms": 10_000},
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 10_000},
            ],
        ) as guard:
            results = asyncio.run(_concurrently(guard.url, [BIG, BIG, SMALL, HUGE], 0.1))
    finally:
        stop(process)
    assert [r[0] for r in results[:3]] == [200, 200, 200]
    status, payload, headers, elapsed = results[3]
    assert (status, payload["error"]["code"]) == (429, "kv_excess")
    assert headers["x-should-retry"] == "false" and elapsed < 0.5
    events = list(read_jsonl(str(tmp_path / "decisions.jsonl")))
    starts = [e.request_id for e in events if e.kind is EventKind.DISPATCH]
    ends = {e.request_id: e.at for e in events if e.kind is EventKind.COMPLETE}
    dispatched = {e.request_id: e.at for e in events if e.kind is EventKind.DISPATCH}
    first, second, small = starts
    assert dispatched[second] >= ends[first]  # 48 + 48 > 64: it waited for room
    assert dispatched[small] >= dispatched[second]  # it would have fit, and did not overtake
