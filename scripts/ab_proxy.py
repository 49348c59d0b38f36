"""Instructions per request of the HTTP guard, for one or more source trees: the machine's
wall clock moves by 1.5× between `bench proxy` runs; callgrind's count does not.

    git worktree add /tmp/old <rev>
    python scripts/ab_proxy.py /tmp/old/src src [--requests 300] [--rounds 2]
    python scripts/ab_proxy.py /tmp/old/src src --own   # the guard less the pass-through
    python scripts/ab_proxy.py src --off log --off metrics --off log,metrics   # what each costs

Per tree and round: `bench proxy`'s proxies' process (the pass-through and the guard, as
`floorguard bench proxy` runs them; in trees before the upstream got its own process, the
upstream too) starts under callgrind with a fixed hash seed and ASLR off; after 50 warm-up
requests its counters are zeroed (`callgrind_control -z`), `--requests` requests are sent to
the guard (or, with `--path`, to the pass-through or the upstream itself, which is then the
process counted), `--concurrency` at a time (1 by default; `bench proxy`'s requests/s runs
32), and the counters are dumped (`-d`). The figure is the whole process's instructions ÷
requests (the guard's health probes and samplers run meanwhile). `--own` counts the
pass-through too and prints the guard's less the pass-through's: the guard's own work, which
the upstream's share (in the one-process trees) and the loop's fixed costs cancel out of.
Every tree runs on the loop `--loop` names (uvloop by default, what `serve` runs where it is
installed), whichever its own bench would have chosen, so that trees compare on one loop.
A tree counts as it is built: compiled where `_compiled.json` matches its sources. `--off`
patches Python functions, which compiled modules call past, so with `--off` every count of
the run, the unpatched one included, is of the pure sources (`FLOORGUARD_PURE=1`).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SECRET = "bench-secret-0123456789abcdef0123456789"  # bench/proxy.py's
PATHS = ("direct", "passthrough", "floorguard")  # bench/proxy.py's, in its ports' order (not
# imported: the child must import floorguard from the tree it counts, after sys.path is set)


def _switch_off(feature: str) -> None:
    """Make one of the guard's per-request features free, to count what it costs: a
    measurement patch of the child's modules, never a mode of the guard (the replies stay
    200, the requests are still admitted and dispatched)."""
    app = importlib.import_module("floorguard.proxy.process.app")
    forward = importlib.import_module("floorguard.proxy.pool.forward")
    pool = importlib.import_module("floorguard.proxy.pool.pool")
    if feature == "log":  # the decision log: appended and serialized
        importlib.import_module(
            "floorguard.proxy.observe.decision_log"
        ).DecisionLog.append = _nothing
    elif feature == "metrics":  # the per-event tallies and histograms, the token counts
        metrics = importlib.import_module("floorguard.proxy.observe.metrics").GuardMetrics
        metrics.on_event = metrics.on_usage = _nothing
    elif feature == "identity":  # the bearer token's check (a cache hit after the first)
        identity = importlib.import_module("floorguard.proxy.edge.identity").Identity
        identity.tenant_of = lambda *_, **__: "acme"
    elif feature == "normalize":  # the body's parse, checks and re-serialization: memoized
        real, memo = app.normalize, {}

        def memoized(raw: bytes, **options: object) -> object:
            if raw not in memo:
                memo[raw] = real(raw, **options)
            return memo[raw]

        app.normalize = memoized
    elif feature == "usage":  # the reply's usage: its parse and its token counts
        forward.usage_of_reply = lambda _: None
    elif feature == "ratelimit":  # the x-ratelimit-* headers
        pool.rate_limit_headers = lambda *_: {}
    elif feature == "reqid":  # a fresh x-request-id per request
        app.secrets.token_hex = lambda n: "0" * 2 * n
    else:
        raise SystemExit(f"--off: no feature {feature!r} (one of {', '.join(FEATURES)})")


def _nothing(*_: object) -> None:
    return None


FEATURES = ("log", "metrics", "identity", "normalize", "usage", "ratelimit", "reqid")


def _one_process(tree: str) -> bool:
    """Whether `tree`'s bench serves the upstream in the proxies' process (its trees before
    the upstream got a process of its own)."""
    bench = os.path.join(tree, "floorguard", "bench", "proxy.py")
    return not os.path.exists(bench) or "def _serve_forever" in open(bench).read()


def _list_models(bench: object) -> None:
    """An older tree's upstream made to list its model at `/v1/models`, as today's does (a
    real backend does): the guard asks a backend that lists none again every half second,
    which would count against the older tree only."""
    if hasattr(bench, "MODELS"):
        return
    from aiohttp import web  # noqa: PLC0415

    make = bench._upstream_app  # type: ignore[attr-defined]

    def with_models() -> web.Application:
        app = make()

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

        app.router.add_get("/v1/models", models)
        return app

    bench._upstream_app = with_models  # type: ignore[attr-defined]


def _serve(tree: str, role: str, ports: list[int], off: list[str], loop: str) -> None:
    """A child: `tree`'s own bench server, `role` "proxies" (with the features `off` switched
    off) or "upstream", on the event loop `loop`."""
    sys.path.insert(0, tree)
    for feature in off:
        _switch_off(feature)
    try:
        bench = importlib.import_module("floorguard.bench.proxy")
    except ModuleNotFoundError:  # older trees: the bench modules sat in the package root
        bench = importlib.import_module("floorguard.bench_proxy")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    log = os.path.join(tempfile.mkdtemp(), "decisions.jsonl")
    new_loop = None
    if loop == "uvloop":
        import uvloop  # noqa: PLC0415

        new_loop = uvloop.new_event_loop
    if not hasattr(bench, "_serve_proxies"):  # one process, run by asyncio.run
        _list_models(bench)
        if new_loop is not None:
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        bench._serve_forever(ports, log)
    elif role == "upstream":
        bench.asyncio.run = lambda main: asyncio.Runner(loop_factory=new_loop).run(main)
        bench._serve_upstream(ports, log)
    else:
        bench.loop_factory = lambda _config: new_loop
        bench._serve_proxies(ports, log)


async def _requests(
    port: int, n: int, zero: object, dump: object, path: str, *, concurrency: int = 1
) -> None:
    import aiohttp  # noqa: PLC0415  # the parent's only
    import jwt  # noqa: PLC0415

    url = f"http://127.0.0.1:{port}/v1/completions"
    token = jwt.encode({"sub": "acme", "exp": time.time() + 3600}, SECRET, algorithm="HS256")
    headers = {"Authorization": f"Bearer {token}"} if path == "floorguard" else {}
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(url, json=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"the guard answered {r.status}")

        for _ in range(600):  # the server starts slowly under callgrind
            try:
                await one()
                break
            except (aiohttp.ClientError, RuntimeError):
                await asyncio.sleep(0.5)
        for _ in range(50):
            await one()
        zero()  # type: ignore[operator]

        async def worker(share: int) -> None:
            for _ in range(share):
                await one()

        await asyncio.gather(*(worker(len(range(i, n, concurrency))) for i in range(concurrency)))
        dump()  # type: ignore[operator]


def count(
    tree: str,
    n: int,
    path: str = "floorguard",
    off: str = "",
    *,
    pure: bool = False,
    concurrency: int = 1,
    loop: str = "uvloop",
) -> float:
    from floorguard.rig.net import free_ports  # noqa: PLC0415

    ports = free_ports(3)
    out = tempfile.mkdtemp()
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"} | (
        {"FLOORGUARD_PURE": "1"} if pure else {}
    )

    def child(role: str, counted: bool) -> subprocess.Popen[bytes]:
        under = ["setarch", "-R", "valgrind", "--tool=callgrind",
                 f"--callgrind-out-file={out}/cg"] if counted else []  # fmt: skip
        return subprocess.Popen(
            [*under, sys.executable, __file__, "--serve", tree, role, *map(str, ports), off, loop],
            env=env,
            stderr=subprocess.DEVNULL,
        )

    if _one_process(tree):
        children = [child("proxies", counted=True)]
    else:
        children = [
            child("upstream", counted=path == "direct"),
            child("proxies", counted=path != "direct"),
        ]
    counted_pid = children[0 if len(children) == 1 or path == "direct" else 1].pid

    def control(flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(counted_pid)], check=True, capture_output=True
        )

    try:
        port = ports[PATHS.index(path)]
        asyncio.run(
            _requests(
                port, n, lambda: control("-z"), lambda: control("-d"), path, concurrency=concurrency
            )
        )
    finally:
        for c in children:
            c.terminate()
            c.wait()
    dump = sorted(glob.glob(f"{out}/cg.*"), key=os.path.getmtime)[0]  # the -d dump
    with open(dump) as f:
        total = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
    assert total is not None, f"no total in {dump}"
    return int(total.group(1)) / n


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        tree, role, *ports, off, loop = sys.argv[2:]
        _serve(tree, role, [int(p) for p in ports], [f for f in off.split(",") if f], loop)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--path", choices=PATHS, default="floorguard",
        help="which of bench proxy's paths the requests take (the references: direct, passthrough)",
    )  # fmt: skip
    parser.add_argument(
        "--own", action="store_true",
        help="count the pass-through as well, and print the guard's count less the pass-through's",
    )  # fmt: skip
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop",
        help="the event loop every tree's proxies run on (uvloop: what serve runs where installed)",
    )  # fmt: skip
    parser.add_argument(
        "--concurrency", type=int, default=1,
        help="requests in flight at once while counting (bench proxy's requests/s runs 32)",
    )  # fmt: skip
    parser.add_argument(
        "--off", action="append", default=[], metavar="FEATURE[,FEATURE]",
        help="count the guard once more per --off, these features made free (one of "
        f"{', '.join(FEATURES)}; several joined by commas): what each costs per request",
    )  # fmt: skip
    ns = parser.parse_args()
    runs = [(tree, "") for tree in ns.trees] + [(ns.trees[-1], off) for off in ns.off]
    seen: dict[str, list[float]] = {}
    for _ in range(ns.rounds):
        for tree, off in runs:
            label = f"{tree} --off {off}" if off else tree

            def counted(path: str, tree: str = tree, off: str = off) -> float:
                return count(
                    tree, ns.requests, path, off, pure=bool(ns.off),
                    concurrency=ns.concurrency, loop=ns.loop,
                )  # fmt: skip

            if ns.own:
                guard, passthrough = counted("floorguard"), counted("passthrough")
                print(f"{label}: floorguard {guard:,.0f}, pass-through {passthrough:,.0f}")
                seen.setdefault(label, []).append(guard - passthrough)
            else:
                seen.setdefault(label, []).append(counted(ns.path))
    first = min(seen[runs[0][0]])
    what = "the guard's own instructions per request" if ns.own else "instructions per request"
    for label, counts in seen.items():
        shown = " · ".join(f"{c:,.0f}" for c in counts)
        print(f"{label}: {what} {shown} (min / first tree's min {min(counts) / first:.3f})")


if __name__ == "__main__":
    main()
