"""`floorguard serve`: the guard (and its admin listener, if configured) on real sockets,
until SIGTERM or SIGINT; then a graceful drain (docs/http.md, Shutdown)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aiohttp import web

from floorguard.proxy.app import SERVER, GuardRunner, create_admin_app, create_app
from floorguard.proxy.config import GuardServerConfig, server_ssl_context

__all__ = ["run_guard", "serve_guard"]


async def serve_guard(
    config: GuardServerConfig,
    stop: asyncio.Event,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve until `stop` is set, then drain: new requests get 503 `draining`, in-flight
    ones get up to `drain_timeout_s`, the decision log is written out."""
    app = create_app(config)
    runner = GuardRunner(
        app,
        handler_cancellation=True,
        keepalive_timeout=config.header_timeout_s,
        shutdown_timeout=config.drain_timeout_s,
        access_log=None,
    )
    await runner.setup()
    ssl_context = server_ssl_context(config.tls) if config.tls else None
    await web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context).start()
    admin_runner = None
    if config.admin.port is not None:
        admin_runner = GuardRunner(create_admin_app(app[SERVER]), access_log=None)
        await admin_runner.setup()
        await web.TCPSite(admin_runner, config.admin.host, config.admin.port).start()
    if on_listening is not None:
        scheme = "https" if ssl_context else "http"
        on_listening(f"{scheme}://{config.host}:{config.port}")
    try:
        await stop.wait()
    finally:
        if admin_runner is not None:
            await admin_runner.cleanup()
        await runner.cleanup()


def run_guard(config: GuardServerConfig, on_listening: Callable[[str], None] | None = None) -> None:
    """`serve_guard` in its own event loop, stopped by SIGTERM or SIGINT."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_guard(config, stop, on_listening)

    asyncio.run(main())
