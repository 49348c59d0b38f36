"""`floorguard serve`: the guard (and its admin listener, if configured) on real sockets,
until SIGTERM or SIGINT; then a graceful drain (docs/http.md, Shutdown). SIGHUP reloads the
configuration file (docs/http.md, Reload)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from floorguard.core.contract import GuardConfig
from floorguard.core.monitors import assumption_report, first_token_report
from floorguard.errors import ConfigError, FloorguardError
from floorguard.profiles import get_profile
from floorguard.proxy.config.guard import GuardServerConfig, server_ssl_context
from floorguard.proxy.process.app import (
    SERVER,
    GuardRunner,
    GuardServer,
    create_admin_app,
    create_app,
)
from floorguard.proxy.process.connections import connection_cap
from floorguard.proxy.process.http_server import freeze_startup_heap
from floorguard.screen.model import DEFAULT_MODEL, ScreenConfig, aggregate, screen
from floorguard.sim.targets import flood_services

__all__ = [
    "event_loop_line",
    "run_guard",
    "screen_config",
    "serve_guard",
    "start_report",
    "start_warnings",
]

log = logging.getLogger("floorguard.proxy")


def screen_config(
    config: GuardServerConfig,
    *,
    service_s: float | None = None,
    aggregation: str = "p99",
    opportunistic_per_s: float = 0.0,
    guard: GuardConfig | None = None,
) -> ScreenConfig:
    """The screen's view of one pool of a serve config: B = its assured floors summed, C =
    its slots summed, its window and dispatch; ŝ given, else `aggregation` of its profile's
    services under a saturating flood (simulated); `s_max` its profile's ceiling at
    `limits.default_max_tokens`. `guard`: the pool's core configuration, where the caller
    built it already."""
    profile = get_profile(config.profile) if config.profile is not None else None
    if service_s is None:
        if profile is None:
            raise FloorguardError("no profile to take ŝ from: give service samples")
        service_s = aggregate(flood_services(profile), aggregation)
    guard = config.guard_config() if guard is None else guard
    return ScreenConfig(
        floor=max(guard.total_floor, 1),
        slots=guard.total_slots,
        service_s=service_s,
        window_s=guard.schedule.window_s,
        dispatch=guard.dispatch,
        opportunistic_rate_per_s=opportunistic_per_s,
        s_max_s=profile.ceiling.at(config.limits.default_max_tokens) if profile else None,
    )


def start_report(config: GuardServerConfig) -> list[str]:
    """What `serve` says before it guards, per pool: docs/design.md §6 at ℓ = the default
    cap, and the screen's verdict (makespan, p99 ŝ of the profile) for the assured
    contracts — once per distinct deadline, naming the tenants that share it (a pool of
    thousands of tenants is screened a few times, not once per tenant)."""
    out = []
    for name, pool in config.pools().items():
        of = f"model {name}: " if name is not None else ""
        tokens = pool.limits.default_max_tokens
        guard = pool.guard_config()
        report = assumption_report(guard, num_output_tokens=tokens)
        if not any(c.assured for c in guard.contracts):
            out.append(f"{of}no assured floor: docs/design.md §6 has nothing to bound")
        elif report.inside and report.bound_s is not None:
            out.append(
                f"{of}docs/design.md §6 at ℓ = {tokens}: inside (ρ_A = {report.rho_a:.2f}; "
                f"the floor's sojourn ≤ s_max·(1+⌈B/C⌉) = {report.bound_s:.3f} s ≤ d = "
                f"{report.min_deadline_budget_s:.3f} s)"
            )
        first = first_token_report(
            guard, num_output_tokens=tokens, num_prompt_tokens=pool.limits.max_prompt_tokens
        )
        if first is not None and first.inside and first.bound_s is not None:
            out.append(
                f"{of}docs/design.md §19 (first tokens) at ℓ = {tokens}: inside (r = "
                f"{first.reserved}, ρ_r = {first.rho_r:.2f}; the floor's first token ≤ "
                f"⌈B/r⌉·s_max + s_max(1) = {first.bound_s:.3f} s ≤ ttft = "
                f"{first.min_ttft_s:.3f} s)"
            )
        out += _memory_lines(pool, guard, of)
        out += _tpot_lines(pool, of)
        if pool.profile is None:
            continue
        view = screen_config(pool, guard=guard)
        by_deadline: dict[float, list[str]] = {}
        for c in guard.contracts:
            if c.assured:
                by_deadline.setdefault(c.deadline_for(tokens), []).append(c.tenant)
        for deadline_s, tenants in by_deadline.items():
            verdict = screen(view, deadline_s, DEFAULT_MODEL)
            out.append(
                f"{of}{_tenants(tenants)}: screen ({DEFAULT_MODEL.value}, p99 ŝ = "
                f"{view.service_s * 1e3:.0f} ms) {'ACCEPT' if verdict.accept else 'REJECT'}"
                f": predicted {verdict.predicted_sojourn_s * 1e3:.0f} ms vs d = "
                f"{deadline_s * 1e3:.0f} ms"
            )
    return out


def _tenants(names: list[str]) -> str:
    if len(names) == 1:
        return f"tenant {names[0]}"
    shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    return f"{len(names)} tenants ({shown})"


def _tpot_lines(pool: GuardServerConfig, of: str) -> list[str]:
    """The width the tightest TPOT allows on the profile (docs/design.md §19)."""
    tpots = [(c.tpot_ms, c.tenant) for c in pool.contracts if c.tpot_ms]
    if not tpots or pool.profile is None:
        return []
    tpot_ms, tenant = min(tpots)
    profile = get_profile(pool.profile)
    widest = max(b.slots for b in pool.backends)
    width = profile.widest_for(tpot_ms / 1e3, widest)
    ceiling = profile.token_ceiling_s(max(width, 1)) * 1e3
    if width == 0:
        return [
            f"{of}TPOT: tenant {tenant}'s {tpot_ms:g} ms is below even one sequence's decode "
            f"step on {pool.profile} ({ceiling:.1f} ms at its slowest): not kept; one slot a "
            "backend"
        ]
    capped = "" if width >= widest else f"; each backend runs at most {width} at once"
    return [
        f"{of}TPOT: tenant {tenant}'s {tpot_ms:g} ms holds at a width of {width} on "
        f"{pool.profile} (a decode step of {width} ≤ {ceiling:.1f} ms){capped}"
    ]


def _memory_lines(pool: GuardServerConfig, guard: GuardConfig, of: str) -> list[str]:
    """Under a KV budget (docs/design.md §16): what each backend holds, and what the largest
    metered request needs (`limits.max_prompt_tokens` + `limits.max_tokens`, in blocks)."""
    if not guard.kv_budgeted:
        return []
    limits = pool.limits
    largest = guard.kv_reservation(limits.max_prompt_tokens, limits.max_tokens)
    out = []
    for backend in pool.backends:
        if backend.kv_tokens is None:
            out.append(f"{of}backend {backend.url}: KV not budgeted (slots only)")
            continue
        fits = backend.kv_tokens // largest
        out.append(
            f"{of}backend {backend.url}: KV {backend.kv_tokens} tokens, {fits} of the largest "
            f"metered request ({largest} tokens: max_prompt_tokens + max_tokens) at once"
            + ("" if fits else ": such a request never starts there")
        )
    return out


def event_loop_line(config: GuardServerConfig) -> str:
    """The event loop `serve` runs on, and why."""
    loop = config.loop_choice()
    why = (
        f"event_loop: {config.event_loop}"
        if loop == "uvloop" or config.event_loop == "asyncio"
        else "uvloop is not installed: pip install 'floorguard[uvloop]'"
    )
    return f"event loop: {loop} ({why})"


def start_warnings(config: GuardServerConfig) -> list[str]:
    """What an operator should read before trusting this configuration, per pool: the
    conditional bound of docs/design.md §6 outside its region (for ℓ =
    `limits.default_max_tokens`), and deadline budgets that even the fastest service of
    that ℓ cannot meet."""
    return [
        (f"model {name}: " if name is not None else "") + warning
        for name, pool in config.pools().items()
        for warning in _pool_warnings(pool)
    ]


def _pool_warnings(config: GuardServerConfig) -> list[str]:
    guard_config = config.guard_config()
    tokens = config.limits.default_max_tokens
    out = []
    report = assumption_report(guard_config, num_output_tokens=tokens)
    if not report.inside:
        out.append(
            f"outside docs/design.md §6's region at ℓ = {tokens} "
            f"({'; '.join(report.reasons)}): the floor (AF) is enforced, but on-time service of "
            "the floor (SF) is not promised here"
        )
    first = first_token_report(
        guard_config, num_output_tokens=tokens, num_prompt_tokens=config.limits.max_prompt_tokens
    )
    if first is not None and not first.inside:
        out.append(
            f"outside docs/design.md §19's first-token region at ℓ = {tokens} "
            f"({'; '.join(first.reasons)}): the floor's first tokens are not promised by its "
            "TTFT (DR on them still holds)"
        )
    if config.profile is not None:
        fastest = get_profile(config.profile).lower.at(tokens)
        fate = "dropped as doomed on arrival" if config.doom_gate else "late, every one"
        for c in guard_config.contracts:
            if (deadline_s := c.deadline_for(tokens)) < fastest:
                out.append(
                    f"tenant {c.tenant}: deadline {deadline_s * 1e3:.0f} ms < the "
                    f"fastest service of ℓ = {tokens} on {config.profile} "
                    f"({fastest * 1e3:.0f} ms): its requests will be {fate}"
                )
    return out


_CLOSE_S = 1.0
"""After the drain: how long closing waits for handlers that were just cut."""


def reload_on_signal(server: GuardServer) -> None:
    """SIGHUP: read the configuration file again and reload it; a refused one is logged and
    the running configuration goes on."""
    try:
        server.reload_file()
    except ConfigError as exc:
        log.error("reload refused, the running configuration goes on: %s", exc)


def _sighup_while_draining() -> None:
    log.warning("SIGHUP ignored: the guard is draining (nothing is reloaded)")


async def serve_guard(
    config: GuardServerConfig,
    stop: asyncio.Event,
    on_listening: Callable[[str, str | None], None] | None = None,
    config_path: str | None = None,
    worker: int | None = None,
) -> None:
    """Serve until `stop` is set, then drain: new requests get 503 `draining`, in-flight
    ones get up to `drain_timeout_s`, the decision log is written out. With `config_path`,
    SIGHUP reloads that file; `worker`: this process is that worker of `workers: N` (its
    `config` is `for_worker(worker)` already), sharing the port with the others.
    `on_listening` is told the URLs it listens on (the guard's, the admin's or None), with
    the ports bound: `port: 0` (and `admin.port: 0`) take one the system gives."""
    app = create_app(config)
    server = app[SERVER]
    server.config_path, server.worker = config_path, worker
    upstream = sum(pool.guard.config.total_slots for pool in app[SERVER].pools.values()) + 34
    cap = connection_cap(config.max_connections, upstream)
    runner = GuardRunner(
        app,
        cap=cap,
        half_close=config.half_close,
        handler_cancellation=True,
        keepalive_timeout=config.header_timeout_s,
        shutdown_timeout=_CLOSE_S,  # the drain happened before: this only closes
        access_log=None,
    )
    await runner.setup()
    ssl_context = server_ssl_context(config.tls) if config.tls else None
    await web.TCPSite(
        runner, config.host, config.port, ssl_context=ssl_context, reuse_port=worker is not None
    ).start()
    admin_runner = None
    if config.admin.port is not None:
        admin_runner = GuardRunner(create_admin_app(app[SERVER]), access_log=None)
        await admin_runner.setup()
        await web.TCPSite(admin_runner, config.admin.host, config.admin.port).start()
    scheme = "https" if ssl_context else "http"
    url = _bound(runner, scheme, config.host)
    admin_url = _bound(admin_runner, "http", config.admin.host) if admin_runner else None
    loop = asyncio.get_running_loop()
    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, reload_on_signal, server)
    freeze_startup_heap()
    if on_listening is not None:
        on_listening(url, admin_url)
    try:
        await stop.wait()
        # never removed: SIGHUP's default action would kill the draining guard
        loop.add_signal_handler(signal.SIGHUP, _sighup_while_draining)
        # design §14: drain while still listening (new requests 503 `draining`, /readyz 503),
        # then cut what the deadline leaves, then close.
        await app[SERVER].drain()
        await app[SERVER].drained(config.drain_timeout_s)
    finally:
        if admin_runner is not None:
            await admin_runner.cleanup()
        await runner.cleanup()


def _bound(runner: web.BaseRunner, scheme: str, host: str) -> str:
    """The URL a runner's one site listens on, with the port the system bound."""
    port = runner.addresses[0][1]
    return f"{scheme}://{host}:{port}"


def run_guard(
    config: GuardServerConfig,
    on_listening: Callable[[str, str | None], None] | None = None,
    config_path: str | None = None,
    worker: int | None = None,
) -> None:
    """`serve_guard` in its own event loop, stopped by SIGTERM or SIGINT (SIGHUP reloads
    `config_path`)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve_guard(config, stop, on_listening, config_path, worker)

    with asyncio.Runner(loop_factory=loop_factory(config)) as runner:
        runner.run(main())


def loop_factory(config: GuardServerConfig) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop `serve` runs `config` on (`loop_choice`): uvloop's, or None for
    asyncio's own (`bench proxy` runs its proxies on the same)."""
    if config.loop_choice() != "uvloop":
        return None
    import uvloop  # noqa: PLC0415  # the optional extra, checked at load

    return uvloop.new_event_loop
