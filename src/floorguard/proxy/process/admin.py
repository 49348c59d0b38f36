"""The guard's admin surface: `/metrics`, `/admin/status`, `/admin/history`, the status
page and `POST /admin/reload` — behind `admin.token` when one is configured, else for
loopback clients only on the main listener — and where the token comes from."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import generate_latest
from yarl import URL

from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.config.identity import sample_secret
from floorguard.proxy.edge.identity import peer_address
from floorguard.proxy.edge.replies import json_error

if TYPE_CHECKING:
    from floorguard.proxy.process.app import GuardServer

__all__ = ["admin_routes", "admin_token"]

log = logging.getLogger("floorguard.proxy")


def admin_token(config: GuardServerConfig, environ: Mapping[str, str]) -> str | None:
    """The admin bearer token: configured, or from its environment variable; at least 16
    characters, and not a sample (`sample_secret`)."""
    if config.admin.token_env is None:
        token, key = config.admin.token, "admin.token"
    else:
        token, key = environ.get(config.admin.token_env) or None, "admin.token_env"
        if token is None or len(token) < 16:
            raise ConfigError(
                key,
                config.admin.token_env,
                "names an environment variable that must hold a token of ≥ 16 characters",
            )
    why = sample_secret(token) if token is not None else None
    if why is not None:
        raise ConfigError(
            key,
            "<hidden>",
            f"the admin token is refused: {why}. Generate one: openssl rand -hex 16",
        )
    return token


def admin_routes(server: GuardServer, app: web.Application, *, loopback_only: bool) -> None:
    """`/metrics` and `/admin/status`: behind `admin.token` when one is configured; on the
    main listener without one, only for loopback clients."""

    def allowed(request: web.Request) -> web.Response | None:
        token = server.admin_token
        if token is not None:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), token.encode()):
                return json_error(401, "admin_token_required", "this path needs the admin token")
            return None
        if loopback_only and not _is_loopback(request.remote):
            return json_error(
                403, "admin_loopback_only", "admin paths answer loopback clients only"
            )
        return _same_site(request)

    async def metrics(request: web.Request) -> web.Response:
        refused = allowed(request)
        if refused is not None:
            return refused
        return web.Response(
            body=generate_latest(server.metrics.registry), content_type="text/plain"
        )

    async def admin_status(request: web.Request) -> web.Response:
        refused = allowed(request)
        if refused is not None:
            return refused
        return web.json_response(server.status())

    async def admin_history(request: web.Request) -> web.Response:
        refused = allowed(request)
        if refused is not None:
            return refused
        return web.json_response({"interval_s": 1.0, "samples": list(server.history)})

    page = status_page()

    async def admin_page(request: web.Request) -> web.Response:
        """The status page: a static shell (no data in it; its script reads `/admin/status`
        and `/admin/history` with the admin token from the URL's `#token=`)."""
        if server.admin_token is None:
            if loopback_only and not _is_loopback(request.remote):
                return json_error(
                    403, "admin_loopback_only", "admin paths answer loopback clients only"
                )
            refused = _same_site(request)
            if refused is not None:
                return refused
        return web.Response(body=page, content_type="text/html", headers=_PAGE_HEADERS)

    async def admin_reload(request: web.Request) -> web.Response:
        """Reload the configuration file (as SIGHUP does); a refused one is answered 400
        with why, and the running configuration goes on."""
        refused = allowed(request)
        if refused is not None:
            return refused
        try:
            summary = server.reload_file()
        except ConfigError as exc:
            log.error("reload refused, the running configuration goes on: %s", exc)
            return json_error(400, "reload_refused", str(exc))
        return web.json_response({"reloaded": True, **summary})

    app.router.add_get("/metrics", metrics)
    app.router.add_post("/admin/reload", admin_reload)
    app.router.add_get("/admin/status", admin_status)
    app.router.add_get("/admin/history", admin_history)
    app.router.add_get("/admin/", admin_page)


def status_page() -> bytes:
    """`admin.html` with the vendored uPlot (its script and style) inlined: no CDN, no
    other request, and the page's Content-Security-Policy stays inline-only."""
    here = resources.files("floorguard.proxy.process")
    vendor = here.joinpath("vendor")
    page = here.joinpath("admin.html").read_text()
    page = page.replace("/*UPLOT_CSS*/", vendor.joinpath("uPlot.min.css").read_text())
    page = page.replace("/*UPLOT_JS*/", vendor.joinpath("uPlot.iife.min.js").read_text())
    return page.encode()


_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def _loopback_host(host: str) -> bool:
    """Whether a `Host` (or an origin's host), port and brackets aside, names this machine
    over loopback: `localhost` or a loopback address."""
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:8080
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name in _LOOPBACK_NAMES or _is_loopback(name)


def _same_site(request: web.Request) -> web.Response | None:
    """Without a token an admin path trusts the loopback peer, so it must also be asked for
    by a loopback name and not from another site: a `Host` that is not loopback is a DNS
    rebinding (a page of another origin resolved to 127.0.0.1), and an `Origin` that is
    not loopback a cross-site request (a page's form posting to `/admin/reload`)."""
    if not _loopback_host(request.host):
        return json_error(
            403,
            "admin_host_not_allowed",
            "without admin.token, admin paths answer requests for localhost only",
        )
    origin = request.headers.get("Origin")
    if origin is not None and not _loopback_host(_origin_host(origin)):
        return json_error(
            403, "admin_cross_site", "admin paths do not answer requests from other sites"
        )
    return None


def _origin_host(origin: str) -> str:
    """The host of an `Origin` header (`null` and anything unparsable: no host)."""
    try:
        url = URL(origin)
    except ValueError:
        return ""
    return url.raw_host or ""


def _is_loopback(remote: str | None) -> bool:
    address = peer_address(remote)
    return address is not None and address.is_loopback
