"""A pool alone: built from a fake host (no HTTP server, no edge), its backends behind a
fake `Upstream` (proxy/pool/upstream.py) the test answers by hand, its clock a
`ManualClock`. Two requests for one slot: the second waits until the first's backend
reply ends, both are answered 200, the guard ends each once, and the decision log — on
virtual time — passes verify."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
from aiohttp.test_utils import make_mocked_request

from floorguard.analysis.checker import check_trace
from floorguard.clock import ManualClock
from floorguard.core.events import TERMINAL_KINDS, EventKind
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


class _Reply:
    """A backend's reply (`UpstreamReply`): status 200, its body what the test feeds it."""

    status = 200

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._eof = False
        self._more = asyncio.Event()
        self.released = False
        self.length: int | None = None

    def feed(self, chunk: bytes, *, eof: bool = True) -> None:
        self._chunks.append(chunk)
        self._eof = eof
        self._more.set()

    async def chunk(self, timeout_s: float) -> bytes:
        async with asyncio.timeout(timeout_s):
            while not self._chunks and not self._eof:
                self._more.clear()
                await self._more.wait()
        return self._chunks.pop(0) if self._chunks else b""

    async def head(self, size: int) -> bytes:
        return await self.chunk(1.0)

    def release(self) -> None:
        self.released = True


class _Transport:
    """The fake `Upstream`: health probes and reports answer 200 (an empty body); each POST
    is recorded with the reply the test will write."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes, _Reply]] = []
        self.posted = asyncio.Event()
        self.reply_length: int | None = None
        """The length the replies' headers declare (None: none)."""

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        return 200, b""

    async def post(self, url: str, body: bytes, headers) -> _Reply:
        reply = _Reply()
        reply.length = self.reply_length
        self.posts.append((url, body, reply))
        self.posted.set()
        return reply


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
    metrics = GuardMetrics({}, clock.now)  # real: a compiled pool checks its type
    return SimpleNamespace(
        clock=clock,
        loop=asyncio.get_running_loop(),  # a host holds its loop (edge/deadline.py)
        replica="unit",
        http_learner=None,
        tracing=None,
        replies=HeldReplies(1 << 20),
        cutting=False,
        num_cut_at_deadline=0,
        metrics=metrics,
        upstream=transport,
        session=None,  # the learner callout's: this pool asks no learner over HTTP
        on_event=events.append,
        fault_hook=None,
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
        transport.posts[0][2].feed(b'{"choices": []}')
        response = await asyncio.wait_for(first, 1.0)
        assert response.status == 200
        await asyncio.wait_for(transport.posted.wait(), 1.0)
        assert [url for url, _, _ in transport.posts] == ["http://backend:8000/v1/completions"] * 2
        clock.advance(0.5)
        transport.posts[1][2].feed(b'{"choices": []}')
        assert (await asyncio.wait_for(second, 1.0)).status == 200
        assert pool.guard.num_in_flight == pool.guard.num_queued == 0
        assert all(reply.released for _, _, reply in transport.posts)  # each given back once
        pool.pump.close()
        return events

    events = asyncio.run(scenario())
    completes = [e for e in events if e.kind is EventKind.COMPLETE]
    assert [(e.request_id, e.at) for e in completes] == [("r1", 100.75), ("r2", 101.25)]
    report = check_trace(events)
    assert report.ok(), report.failed()


def test_a_reply_is_whole_once_its_declared_length_is_in_without_waiting_for_its_end():
    """A backend's reply whose headers declare its length ends the request once that many
    bytes are read: the reader does not wait for (or read) the end of the stream. The
    fake reply here never ends: a reader that waited for its end would time out."""

    async def scenario():
        clock, transport, events = ManualClock(100.0), _Transport(), []
        pool = Pool(_host(clock, transport, events), None, GuardServerConfig.model_validate(CONFIG))
        await pool.health.probe_all(transport)
        body = b'{"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}'
        transport.reply_length = len(body)
        request = make_mocked_request("POST", "/v1/completions", transport=_ClientTransport())
        answer = asyncio.ensure_future(
            pool.handle(
                request, "/v1/completions", _work({"prompt": "x"}), tenant="acme", rid="r1",
                request_id="r1",
            )
        )  # fmt: skip
        await transport.posted.wait()
        reply = transport.posts[0][2]
        reply.feed(body[:10], eof=False)
        reply.feed(body[10:], eof=False)
        response = await asyncio.wait_for(answer, 1.0)
        pool.pump.close()
        return response, body, events

    response, body, events = asyncio.run(scenario())
    assert response.status == 200 and response.body == body
    assert [e.kind for e in events if e.kind in TERMINAL_KINDS] == [EventKind.COMPLETE]
