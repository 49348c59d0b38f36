"""Instructions per request of the HTTP guard, for one or more source trees: the machine's
wall clock moves by 1.5× between `bench proxy` runs; callgrind's count does not.

    git worktree add /tmp/old <rev>
    python scripts/ab_proxy.py /tmp/old/src src [--requests 300] [--rounds 2]

Per tree and round: `bench proxy`'s server process (the upstream, the pass-through and the
guard in one child, as `floorguard bench proxy` runs them) starts under callgrind with a
fixed hash seed and ASLR off; after 50 warm-up requests its counters are zeroed
(`callgrind_control -z`), `--requests` sequential guard requests are sent, and the counters
are dumped (`-d`). The figure is the whole process's instructions ÷ requests (the upstream's
share is the same for every tree; the guard's health probes and samplers run meanwhile).
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


def _serve(tree: str, ports: list[int]) -> None:
    """The child: `bench proxy`'s server, from `tree`'s own bench module."""
    sys.path.insert(0, tree)
    try:
        bench = importlib.import_module("floorguard.bench.proxy")
    except ModuleNotFoundError:  # before issue 13: the bench modules sat in the package root
        bench = importlib.import_module("floorguard.bench_proxy")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    bench._serve_forever(ports, os.path.join(tempfile.mkdtemp(), "decisions.jsonl"))


async def _requests(port: int, n: int, zero: object, dump: object) -> None:
    import aiohttp  # noqa: PLC0415  # the parent's only
    import jwt  # noqa: PLC0415

    url = f"http://127.0.0.1:{port}/v1/completions"
    token = jwt.encode({"sub": "acme", "exp": time.time() + 3600}, SECRET, algorithm="HS256")
    headers = {"Authorization": f"Bearer {token}"}
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
        for _ in range(n):
            await one()
        dump()  # type: ignore[operator]


def count(tree: str, n: int) -> float:
    from floorguard.rig.net import free_ports  # noqa: PLC0415

    ports = free_ports(3)
    out = tempfile.mkdtemp()
    child = subprocess.Popen(
        ["setarch", "-R", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg",
         sys.executable, __file__, "--serve", tree, *map(str, ports)],
        env={**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"},
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def control(flag: str) -> None:
        subprocess.run(["callgrind_control", flag, str(child.pid)], check=True, capture_output=True)

    try:
        asyncio.run(_requests(ports[2], n, lambda: control("-z"), lambda: control("-d")))
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
        _serve(sys.argv[2], [int(p) for p in sys.argv[3:6]])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    ns = parser.parse_args()
    seen: dict[str, list[float]] = {}
    for _ in range(ns.rounds):
        for tree in ns.trees:
            seen.setdefault(tree, []).append(count(tree, ns.requests))
    first = min(seen[ns.trees[0]])
    for tree, counts in seen.items():
        shown = " · ".join(f"{c:,.0f}" for c in counts)
        print(f"{tree}: instructions per request {shown} (min / first tree's min "
              f"{min(counts) / first:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
