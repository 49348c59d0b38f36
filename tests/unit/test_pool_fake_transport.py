"""A pool alone: built from a fake host (no HTTP server, no edge), its upstream a fake
transport the test answers by hand, its clock a `ManualClock`. Two requests for one slot:
the second waits until the first's backend reply ends, both are answered 200, the guard
ends each once, and the decision log — on virtual time — passes verify."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
from aiohttp.test_utils import make_mocked_request

from floorguard.analysis.checker import check_trace
from floorguard.clock import ManualClock
from floorguard.core.events import EventKind
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.edge.normalize import Work
from floorguard.proxy.observe.metrics import GuardMetrics
from floorguard.proxy.pool.pool import Pool
from floorguard.proxy.pool.relay import HeldReplies

CONFIG = {
    "contracts": [
        {"tenant": "acme", "class": "assured", "floor": 3, "deadline_ms": 5000},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 5000},
    ],
    "backends": [{"url": "http://backend:8000", "slots": 1}],
    "identity": {"mode": "header", "header": "X-Tenant", "trusted_upstreams": ["127.0.0.1/32"]},
}


class _Content:
    """The upstream body: what the test feeds it, read as aiohttp's StreamReader is."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._eof = False
        self._more = asyncio.Event()

    def feed(self, chunk: bytes, *, eof: bool = True) -> None:
        self._chunks.append(chunk)
        self._eof = eof
        self._more.set()

    def read_nowait(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    async def readany(self) -> bytes:
        while not self._chunks and not self._eof:
            self._more.clear()
            await self._more.wait()
        return self.read_nowait()


class _Upstream:
    status = 200

    def __init__(self) -> None:
        self.content = _Content()

    async def __aenter__(self) -> _Upstream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _Probe:
    status = 200

    async def __aenter__(self) -> _Probe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _Transport:
    """The fake session: health probes answer 200; each POST is recorded with the reply
    the test will write."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes, _Upstream]] = []
        self.posted = asyncio.Event()

    def get(self, url, **_):
        return _Probe()

    async def post(self, url, *, data, headers, allow_redirects):
        upstream = _Upstream()
        self.posts.append((url, data, upstream))
        self.posted.set()
        return upstream


class _ClientTransport(asyncio.Transport):
    """The client's connection: open, its write buffer empty (what a compiled pool reads
    of it is typed, so not a Mock)."""

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)

    def get_extra_info(self, name, default=None):
        return default


def _host(clock, transport, events):
    async def checkpoint(point):
        return None

    metrics = GuardMetrics({}, clock.now)  # real: a compiled pool checks its type
    return SimpleNamespace(
        clock=clock,
        replica="unit",
        http_learner=None,
        tracing=None,
        replies=HeldReplies(1 << 20),
        cutting=False,
        num_cut_at_deadline=0,
        metrics=metrics,
        session=transport,
        on_event=events.append,
        checkpoint=checkpoint,
    )


def _work(body: dict) -> Work:
    return Work(orjson.dumps(body), 8, 4, None, stream=False)


def test_a_pool_runs_two_requests_on_one_slot_with_a_fake_transport_on_virtual_time():
    async def scenario():
        clock, transport, events = ManualClock(100.0), _Transport(), []
        pool = Pool(_host(clock, transport, events), None, GuardServerConfig.model_validate(CONFIG))
        await pool.health.probe_all(transport)

        def handle(rid, tenant):
            request = make_mocked_request("POST", "/v1/completions", transport=_ClientTransport())
            return asyncio.ensure_future(
                pool.handle(
                    request,
                    "/v1/completions",
                    _work({"prompt": rid}),
                    tenant=tenant,
                    rid=rid,
                    request_id=rid,
                )
            )

        first = handle("r1", "acme")
        await transport.posted.wait()
        transport.posted.clear()
        clock.advance(0.25)
        second = handle("r2", "free")
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(transport.posts) == 1 and pool.guard.num_queued == 1  # one slot: it waits
        clock.advance(0.5)
        transport.posts[0][2].content.feed(b'{"choices": []}')
        response = await asyncio.wait_for(first, 1.0)
        assert response.status == 200
        await asyncio.wait_for(transport.posted.wait(), 1.0)
        assert [url for url, _, _ in transport.posts] == ["http://backend:8000/v1/completions"] * 2
        clock.advance(0.5)
        transport.posts[1][2].content.feed(b'{"choices": []}')
        assert (await asyncio.wait_for(second, 1.0)).status == 200
        assert pool.guard.num_in_flight == pool.guard.num_queued == 0
        pool.pump.close()
        return events

    events = asyncio.run(scenario())
    completes = [e for e in events if e.kind is EventKind.COMPLETE]
    assert [(e.request_id, e.at) for e in completes] == [("r1", 100.75), ("r2", 101.25)]
    report = check_trace(events)
    assert report.ok(), report.failed()
