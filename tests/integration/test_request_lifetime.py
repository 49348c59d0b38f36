"""Every request ends once and every slot is released once, on every path (docs/design.md §12):
a fault — an exception, a cancellation, a timeout, a broken connection — is injected at
each await point of the request path (parse, store call, learner call, queue wait,
connect, headers, mid-stream) or the client hangs up, and afterwards no slot or queue
place is held, the decision log passes the checker, and the guard still serves an
entitled request. The guard runs on real loopback HTTP with a real redis-server floor and
an HTTP learner."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floorguard.analysis.checker import check_trace
from floorguard.core.events import read_jsonl
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.process.app import SERVER
from tests.integration.live import guard_config, token
from tests.integration.test_learner_callout import LearnerService
from tests.redis_server import RedisServer

POINTS = ("parse", "store", "learner", "queue", "connect", "headers", "stream")
FAULTS = {
    "exception": lambda: RuntimeError("injected"),
    "cancel": asyncio.CancelledError,
    "timeout": TimeoutError,
    "connection": lambda: aiohttp.ClientOSError(104, "injected reset"),
}


class Plan:
    """Where the next request fails: one point, one fault, once."""

    def __init__(self) -> None:
        self.point: str | None = None
        self.fault = "exception"
        self.fired = False

    async def hook(self, point: str) -> None:
        if point == self.point:
            self.point, self.fired = None, True
            raise FAULTS[self.fault]()


@pytest.fixture(scope="module")
def rig(live, tmp_path_factory):
    redis_server = RedisServer().start()
    learner = LearnerService()
    learner_url, _ = live.serve(learner.app)
    log = tmp_path_factory.mktemp("lifetime") / "decisions.jsonl"
    base = guard_config(live.emulator(), floor=1000, decision_log=str(log))
    config = GuardServerConfig.model_validate(
        {
            **base.model_dump(by_alias=True, exclude={"learner", "learner_http", "store"}),
            "learner": "http",
            "learner_http": {"url": learner_url + "/propose", "timeout_ms": 500},
            "store": {"url": redis_server.url, "timeout_ms": 500},
        }
    )
    plan = Plan()
    url, app = live.guard(config, fault_hook=plan.hook)
    yield url, app, plan, log
    redis_server.close()


async def _request(url: str, tenant: str, stream: bool, hang_up: bool) -> int | None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 8, "stream": stream}
    headers = {"Authorization": f"Bearer {token(tenant)}"}
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(url + "/v1/completions", json=body, headers=headers) as r,
        ):
            if hang_up:
                await r.content.readany()
                return None  # leave mid-reply
            await r.read()
            return r.status
    except aiohttp.ClientError:
        return None  # the guard closed the connection (a cancelled handler)


def _settled(app, timeout_s: float = 5.0) -> bool:
    guard = app[SERVER].guard
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if guard.num_in_flight == 0 and guard.num_queued == 0:
            return True
        time.sleep(0.02)
    return False


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    point=st.sampled_from((*POINTS, None)),
    fault=st.sampled_from(sorted(FAULTS)),
    tenant=st.sampled_from(["acme", "free"]),
    stream=st.booleans(),
    hang_up=st.booleans(),
)
def test_a_fault_anywhere_leaves_nothing_held_and_the_log_verified(
    live, rig, point, fault, tenant, stream, hang_up
):
    url, app, plan, log = rig
    plan.point, plan.fault, plan.fired = point, fault, False
    status = live.run(_request(url, tenant, stream, hang_up))
    assert status is None or status < 600
    reachable = point is not None and (
        point not in ("store", "learner") or (point == "store") == (tenant == "acme")
    )
    assert plan.fired == reachable, "the fault was injected where the request passes"
    plan.point = None
    assert _settled(app), app[SERVER].status()["queues"]
    assert live.run(_request(url, "acme", False, False)) == 200
    assert _settled(app)
    live.flush_log(app)
    report = check_trace(list(read_jsonl(str(log))))
    assert report.ok(), report.violations[:3]


@pytest.mark.parametrize("fault", ["exception", "cancel"])
def test_an_arrival_that_fails_at_the_store_call_still_takes_its_credit(live, tmp_path, fault):
    """A fault while the shared-floor call is out ends the arrival as `abort`; the call is
    still made, so the credit is taken, as the log's checker assumes of an arrival within B
    that ended before its decision: with B = 2 the next arrival is entitled and the one
    after is refused — and the log passes the checker (it would report AF otherwise)."""
    redis_server = RedisServer().start()
    try:
        log = tmp_path / "decisions.jsonl"
        base = guard_config(
            live.emulator(), floor=2, window_s=600.0, decision_log=str(log), excess_policy="reject"
        )
        config = GuardServerConfig.model_validate(
            {
                **base.model_dump(by_alias=True, exclude={"store"}),
                "store": {"url": redis_server.url, "timeout_ms": 500, "prefix": f"t-{fault}"},
            }
        )
        plan = Plan()
        url, app = live.guard(config, fault_hook=plan.hook)
        plan.point, plan.fault = "store", fault
        first = live.run(_request(url, "acme", False, False))
        assert plan.fired and first in (None, 500)
        statuses = [live.run(_request(url, "acme", False, False)) for _ in range(2)]
        assert statuses == [200, 429]
        assert _settled(app)
        live.flush_log(app)
        report = check_trace(list(read_jsonl(str(log))))
        assert report.ok(), report.violations[:3]
        assert report.counts["abort"] == 1
    finally:
        redis_server.close()
