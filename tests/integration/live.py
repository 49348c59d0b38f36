"""Run aiohttp apps on real loopback sockets in a background event loop, for tests that
use synchronous clients (the official `openai` client) or their own async clients."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

import jwt
from aiohttp import web

from floorguard.proxy.config.guard import GuardServerConfig, server_ssl_context
from floorguard.proxy.process.app import SERVER, FaultHook, GuardRunner, create_app
from floorguard.rig.emulator import Emulator, create_emulator_app

T = TypeVar("T")
SECRET = "test-secret-0123456789abcdef0123456789"
ISSUER, AUDIENCE = "https://auth.test", "floorguard"


def token(tenant: str = "acme", *, ttl_s: float = 600, secret: str = SECRET, **claims: Any) -> str:
    body = {"sub": tenant, "iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + ttl_s, **claims}
    return jwt.encode(body, secret, algorithm="HS256")


class Bearer(Mapping[str, dict[str, str]]):
    """`Authorization` headers for the named tenants, each minted when it is read: a header
    minted at import would expire (`ttl_s`) before a long suite reaches its last test."""

    def __init__(self, *tenants: str) -> None:
        self._tenants = tenants

    def __getitem__(self, tenant: str) -> dict[str, str]:
        if tenant not in self._tenants:
            raise KeyError(tenant)
        return {"Authorization": f"Bearer {token(tenant)}"}

    def __iter__(self) -> Iterator[str]:
        return iter(self._tenants)

    def __len__(self) -> int:
        return len(self._tenants)


def guard_config(
    backend_url: str,
    *,
    floor: int = 3,
    slots: int = 4,
    window_s: float = 1.0,
    decision_log: str | None = None,
    excess_policy: str = "spare",
    **extra: Any,
) -> GuardServerConfig:
    return GuardServerConfig.model_validate(
        {
            "window_s": window_s,
            "contracts": [
                {
                    "tenant": "acme",
                    "class": "assured",
                    "floor": floor,
                    "deadline_ms": 1820,
                    "excess_policy": excess_policy,
                },
                {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
            ],
            "backends": [{"url": backend_url, "slots": slots}],
            "identity": {
                "mode": "jwt",
                "jwt": {
                    "algorithms": ["HS256"],
                    "secret": SECRET,
                    "issuer": ISSUER,
                    "audience": AUDIENCE,
                },
            },
            "decision_log": decision_log,
            **extra,
        }
    )


class Live:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def serve(
        self, factory: Callable[[], web.Application], ssl_context: ssl.SSLContext | None = None
    ) -> tuple[str, web.Application]:
        """Build the app *in the loop's thread* (no compiling in two threads at once) and
        serve it on a free loopback port (HTTPS with `ssl_context`)."""

        async def start() -> tuple[int, web.Application]:
            app = factory()
            runner = GuardRunner(app, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
            await site.start()
            self._runners.append(runner)
            return site._server.sockets[0].getsockname()[1], app  # type: ignore[union-attr]

        port, app = self.run(start())
        return f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}", app

    def emulator(self, profile: str = "v100-moe", slots: int = 4) -> str:
        return self.serve(lambda: create_emulator_app(Emulator(profile, slots)))[0]

    def guard(
        self, config: GuardServerConfig, fault_hook: FaultHook | None = None
    ) -> tuple[str, web.Application]:
        context = server_ssl_context(config.tls) if config.tls else None
        return self.serve(lambda: create_app(config, fault_hook=fault_hook), context)

    def flush_log(self, app: web.Application) -> None:
        """Write the guard's pending decision-log lines (on the loop's thread)."""

        async def flush() -> None:
            app[SERVER].flush_log()

        self.run(flush())

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
