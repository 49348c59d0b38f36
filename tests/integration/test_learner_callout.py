"""The HTTP learner callout over real loopback HTTP: the learner governs only the surplus,
a floor-entitled request never calls it, and a slow, failing, garbled or absent learner
rejects the surplus as a counted fault while the guard keeps serving."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.process.app import SERVER
from tests.integration.live import guard_config, token


class LearnerService:
    """A learner on loopback whose behaviour a test sets: admit, refuse, stall, break."""

    def __init__(self) -> None:
        self.mode = "admit"
        self.seen: list[dict] = []

    def app(self) -> web.Application:
        async def propose(request: web.Request) -> web.Response:
            self.seen.append(await request.json())
            if self.mode == "stall":
                await asyncio.sleep(1.0)
            if self.mode == "error":
                return web.json_response({"detail": "boom"}, status=500)
            if self.mode == "garbage":
                return web.Response(text="admit, probably")
            return web.json_response(
                {"admit": self.mode == "admit", "proposed_class": None, "priority_hint": 2}
            )

        app = web.Application()
        app.router.add_post("/propose", propose)
        return app


@pytest.fixture(scope="module")
def learner(live):
    service = LearnerService()
    url, _ = live.serve(service.app)
    return service, url + "/propose"


def callout_config(backend: str, learner_url: str) -> GuardServerConfig:
    base = guard_config(backend, floor=2)
    return GuardServerConfig.model_validate(
        {
            **base.model_dump(by_alias=True, exclude={"learner", "learner_http"}),
            "learner": "http",
            "learner_http": {"url": learner_url, "timeout_ms": 100},
        }
    )


def _post(live, url, tenant):
    async def go():
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url + "/v1/completions",
                json={"model": "m", "prompt": "hi", "max_tokens": 2},
                headers={"Authorization": f"Bearer {token(tenant)}"},
            ) as r,
        ):
            body = await r.json()
            return r.status, r.headers.get("x-floorguard-decision"), body

    return live.run(go())


@pytest.fixture
def guarded(live, learner):
    service, learner_url = learner
    service.mode, service.seen = "admit", []
    url, app = live.guard(callout_config(live.emulator(), learner_url))
    return service, url, app[SERVER]


def test_the_floor_never_calls_the_learner_and_the_surplus_follows_it(live, guarded):
    service, url, server = guarded
    assert [_post(live, url, "acme")[1] for _ in range(2)] == ["entitled", "entitled"]
    assert service.seen == []  # B = 2 entitled requests: no callout
    status, decision, _ = _post(live, url, "free")
    assert (status, decision) == (200, "surplus")
    assert service.seen[-1]["class"] == "opportunistic"
    assert service.seen[-1]["max_tokens"] == 2
    load = {"in_flight", "queued_entitled", "queued_surplus", "slots"}
    assert set(service.seen[-1]["load"]) == load
    service.mode = "refuse"
    status, _, body = _post(live, url, "free")
    assert (status, body["error"]["code"]) == (429, "learner_reject")
    assert server.guard.stats.learner_faults == 0


@pytest.mark.parametrize(
    ("mode", "outcome"), [("stall", "timeout"), ("error", "error"), ("garbage", "error")]
)
def test_a_failing_learner_rejects_the_surplus_as_a_counted_fault(live, guarded, mode, outcome):
    service, url, server = guarded
    service.mode = mode
    status, _, body = _post(live, url, "free")
    assert (status, body["error"]["code"]) == (429, "learner_fault")
    assert server.guard.stats.learner_faults == 1
    assert server.http_learner.outcomes[outcome] == 1
    assert _post(live, url, "acme")[:2] == (200, "entitled")  # the floor is untouched


def test_an_unreachable_learner_is_a_fault_and_the_guard_keeps_serving(live):
    url, _ = live.guard(callout_config(live.emulator(), "http://127.0.0.1:9/propose"))
    status, _, body = _post(live, url, "free")
    assert (status, body["error"]["code"]) == (429, "learner_fault")
    assert _post(live, url, "acme")[:2] == (200, "entitled")
    metrics = live.run(_get(url + "/metrics"))
    assert 'floorguard_learner_callouts_total{outcome="error"} 1.0' in metrics


async def _get(url):
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return await r.text()


def test_the_example_learner_service_governs_the_surplus(live):
    """examples/learner_service.py behind `learner: http`: it admits while the surplus
    queue is short, and its hint (max_tokens) reaches the guard's trace."""
    path = Path(__file__).parents[2] / "examples" / "learner_service.py"
    spec = importlib.util.spec_from_file_location("learner_service", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def app():
        example = web.Application()
        example.router.add_post("/propose", module.propose)
        return example

    learner_url, _ = live.serve(app)
    url, guard_app = live.guard(callout_config(live.emulator(), learner_url + "/propose"))
    assert _post(live, url, "free")[:2] == (200, "surplus")
    assert guard_app[SERVER].http_learner.outcomes == {"ok": 1}
