"""`identity.jwt.jwks_url` against a real `floorguard serve` and a local identity provider
(an aiohttp server on loopback) that rotates its signing key: the guard follows the
rotation without a restart, refuses the retired key, does not fetch the set once per
made-up `kid`, and refuses to start where the set cannot be fetched."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import aiohttp
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from floorguard.rig.net import free_port_run
from tests.integration.processes import emulate, refused_start, serve, stop


class Provider:
    """An identity provider's JWKS endpoint on loopback, on its own thread: `publish` sets
    the keys it serves; `fetches` counts the GETs."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0
        self.port = free_port_run(1)
        self.url = f"http://127.0.0.1:{self.port}/.well-known/jwks.json"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def publish(self, *kids: str) -> None:
        for kid in kids:
            self.keys.setdefault(
                kid, rsa.generate_private_key(public_exponent=65537, key_size=2048)
            )
        self.keys = {kid: self.keys[kid] for kid in kids}

    def token(self, kid: str, key: rsa.RSAPrivateKey | None = None) -> str:
        claims = {"sub": "acme", "exp": time.time() + 600}
        return jwt.encode(claims, key or self.keys[kid], algorithm="RS256", headers={"kid": kid})

    async def _jwks(self, _: web.Request) -> web.Response:
        self.fetches += 1
        entries = [
            {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "RS256"}
            for kid, key in self.keys.items()
        ]
        return web.json_response({"keys": entries})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/.well-known/jwks.json", self._jwks)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> Provider:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    url, process = emulate()
    yield url
    stop(process)


def _config(jwks_url: str, backend: str) -> dict:
    return {
        "contracts": [{"tenant": "acme", "class": "assured", "floor": 100, "deadline_ms": 5000}],
        "backends": [{"url": backend, "slots": 4}],
        "identity": {
            "mode": "jwt",
            "jwt": {"algorithms": ["RS256"], "jwks_url": jwks_url, "jwks_min_refresh_s": 2.0},
        },
    }


async def _statuses(url: str, tokens: list[str]) -> list[int]:
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    out = []
    async with aiohttp.ClientSession() as session:
        for token in tokens:
            headers = {"Authorization": f"Bearer {token}"}
            async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
                await r.read()
                out.append(r.status)
    return out


async def _admin_status(url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(url + "/admin/status") as r:
        return await r.json()


def test_a_rotated_signing_key_is_followed_without_a_restart(tmp_path, backend):
    with Provider() as provider:
        provider.publish("k1")
        old = provider.keys["k1"]
        with (tmp_path / "guard.err").open("wb") as err:
            url, process = serve(_config(provider.url, backend), tmp_path / "guard.yaml", err)
        try:
            assert asyncio.run(_statuses(url, [provider.token("k1")])) == [200]
            assert provider.fetches == 1  # at start
            provider.publish("k1", "k2")  # the provider rotates: the new key published
            time.sleep(2.1)  # past jwks_min_refresh_s since the start's fetch
            assert asyncio.run(_statuses(url, [provider.token("k2")])) == [200]
            assert provider.fetches == 2  # the unknown kid fetched the set once
            provider.publish("k2")  # … and the old key retired
            time.sleep(2.1)
            made_up = [provider.token(f"forged-{n}", old) for n in range(40)]
            assert asyncio.run(_statuses(url, made_up)) == [401] * 40
            assert provider.fetches == 3  # 40 unknown kids: one fetch, not 40
            assert asyncio.run(_statuses(url, [provider.token("k1", old)])) == [401]
            assert asyncio.run(_statuses(url, [provider.token("k2")])) == [200]
            status = asyncio.run(_admin_status(url))
            assert status["jwks"] == {"url": provider.url, "kids": ["k2"], "fetches": 3}
        finally:
            stop(process)
    said = (tmp_path / "guard.err").read_text()
    assert "Traceback" not in said and "kids ['k2']" in said


def test_a_jwks_url_that_cannot_be_fetched_refuses_the_start(tmp_path, backend):
    dead = f"http://127.0.0.1:{free_port_run(1)}/jwks.json"
    said = refused_start(_config(dead, backend), tmp_path / "guard.yaml")
    assert "identity.jwt.jwks_url" in said and "cannot be fetched" in said
    assert "Traceback" not in said
