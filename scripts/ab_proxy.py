"""Instructions per request of the HTTP guard, for one or more source trees: the machine's
wall clock moves by 1.5× between `bench proxy` runs; callgrind's count does not.

    git worktree add /tmp/old <rev>
    python scripts/ab_proxy.py /tmp/old/src src [--requests 300] [--rounds 2]
    python scripts/ab_proxy.py src --off log --off metrics --off log,metrics   # what each costs

Per tree and round: `bench proxy`'s server process (the upstream, the pass-through and the
guard in one child, as `floorguard bench proxy` runs them) starts under callgrind with a
fixed hash seed and ASLR off; after 50 warm-up requests its counters are zeroed
(`callgrind_control -z`), `--requests` requests are sent to the guard (or, with `--path`, to
the pass-through or the upstream itself), `--concurrency` at a time (1 by default; `bench
proxy`'s requests/s runs 32), and the counters are dumped (`-d`). The figure is the whole
process's instructions ÷ requests (the upstream's share is the same for every tree; the
guard's health probes and samplers run meanwhile).
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


def _serve(tree: str, ports: list[int], off: list[str]) -> None:
    """The child: `bench proxy`'s server, from `tree`'s own bench module, with the features
    `off` switched off."""
    sys.path.insert(0, tree)
    for feature in off:
        _switch_off(feature)
    try:
        bench = importlib.import_module("floorguard.bench.proxy")
    except ModuleNotFoundError:  # older trees: the bench modules sat in the package root
        bench = importlib.import_module("floorguard.bench_proxy")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    bench._serve_forever(ports, os.path.join(tempfile.mkdtemp(), "decisions.jsonl"))


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
) -> float:
    from floorguard.rig.net import free_ports  # noqa: PLC0415

    ports = free_ports(3)
    out = tempfile.mkdtemp()
    child = subprocess.Popen(
        ["setarch", "-R", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg",
         sys.executable, __file__, "--serve", tree, *map(str, ports), off],
        env={**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
        | ({"FLOORGUARD_PURE": "1"} if pure else {}),
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def control(flag: str) -> None:
        subprocess.run(["callgrind_control", flag, str(child.pid)], check=True, capture_output=True)

    try:
        port = ports[PATHS.index(path)]
        asyncio.run(
            _requests(
                port, n, lambda: control("-z"), lambda: control("-d"), path, concurrency=concurrency
            )
        )
    finally:
        child.terminate()
        child.wait()
    dump = sorted(glob.glob(f"{out}/cg.*"), key=os.path.getmtime)[0]  # the -d dump
    with open(dump) as f:
        total = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
    assert total is not None, f"no total in {dump}"
    return int(total.group(1)) / n


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve(
            sys.argv[2], [int(p) for p in sys.argv[3:6]], [f for f in sys.argv[6].split(",") if f]
        )
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
            counted = count(
                tree, ns.requests, ns.path, off, pure=bool(ns.off), concurrency=ns.concurrency
            )
            seen.setdefault(label, []).append(counted)
    first = min(seen[ns.trees[0]])
    for tree, counts in seen.items():
        shown = " · ".join(f"{c:,.0f}" for c in counts)
        print(f"{tree}: instructions per request {shown} (min / first tree's min "
              f"{min(counts) / first:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
