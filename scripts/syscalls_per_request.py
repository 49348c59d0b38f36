"""System calls a request: the guard beside the bare aiohttp pass-through, counted by strace.

`bench proxy`'s layout (the upstream in its own process; the pass-through and the guard in
one process on `serve`'s event loop): each path is warmed up, then `strace -c -f` is
attached to the proxies' process over `--requests` sequential non-streamed completions, and
each system call's count a request is printed for both paths.

    python scripts/syscalls_per_request.py [--requests 200]

Needs `strace` (Debian's package) and the right to trace a child (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp
import jwt

from floorguard.bench.proxy import (
    SECRET,
    _latencies,
    _serve_proxies,
    _serve_upstream,
    serving_in_child,
)
from floorguard.rig.net import free_ports

_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", re.MULTILINE)


def _send(url: str, headers: dict[str, str], n: int) -> None:
    async def send() -> None:
        async with aiohttp.ClientSession() as session:
            await _latencies(session, url, n, headers)

    asyncio.run(send())


def _counted(pid: int, url: str, headers: dict[str, str], n: int, out: Path) -> dict[str, int]:
    tracer = subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)], stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)  # attached to every thread
    _send(url, headers, n)
    time.sleep(0.3)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(30)
    return {name: int(calls) for calls, name in _ROW.findall(out.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("strace") is None:
        sys.exit("strace is not installed (apt-get install strace)")
    ports = free_ports(3)
    token = jwt.encode({"sub": "acme", "exp": time.time() + 3600}, SECRET, algorithm="HS256")
    paths = {
        "pass-through": (f"http://127.0.0.1:{ports[1]}/v1/completions", {}),
        "floorguard": (
            f"http://127.0.0.1:{ports[2]}/v1/completions",
            {"Authorization": f"Bearer {token}"},
        ),
    }
    counts = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        stack.enter_context(serving_in_child(_serve_upstream, ports[:1]))
        proxies, _ = stack.enter_context(serving_in_child(_serve_proxies, ports))
        assert proxies.pid is not None
        for name, (url, headers) in paths.items():
            _send(url, headers, 200)  # warm: connections, caches
            counts[name] = _counted(
                proxies.pid, url, headers, args.requests, Path(folder) / f"{name}.txt"
            )
    names = sorted(set(counts["pass-through"]) | set(counts["floorguard"]))
    print(f"system calls a request, {args.requests} sequential requests a path")
    print(f"{'call':16s} {'pass-through':>13s} {'floorguard':>11s}")
    for name in names:
        through, guard = (counts[p].get(name, 0) / args.requests for p in paths)
        print(f"{name:16s} {through:13.2f} {guard:11.2f}")


if __name__ == "__main__":
    main()
