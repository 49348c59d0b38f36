"""`floorguard` subprocesses for tests that need real processes (signals, crashes)."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import yaml

from tests.redis_server import free_port

STARTED: list[subprocess.Popen] = []
"""Every process `floorguard()` started, so a fixture can kill what a failed test left
running (tests/integration/conftest.py): a replica left behind keeps renewing its leases
and disturbs the fleet tests after it."""


def wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"process exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {port}") from None
            time.sleep(0.1)


def floorguard(
    *args: str, stderr: IO[bytes] | None = None, max_files: int | None = None
) -> subprocess.Popen:
    """`python -m floorguard ARGS`; `max_files`: its descriptor limit, soft and hard (a
    container's `ulimit -n`)."""

    def limit() -> None:
        if max_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))

    process = subprocess.Popen(  # the hook makes one syscall and takes no lock: safe here
        [sys.executable, "-m", "floorguard", *args],
        stderr=stderr,
        preexec_fn=limit if max_files is not None else None,  # noqa: PLW1509
    )
    STARTED.append(process)
    return process


def _listening(port: int, process: subprocess.Popen) -> None:
    """`wait_listening`, the process killed if it never listens (its caller gets no handle
    to stop it with)."""
    try:
        wait_listening(port, process)
    except BaseException:
        stop(process)
        raise


def emulate(
    slots: int = 4, model: str | None = None, kv_blocks: int | None = None
) -> tuple[str, subprocess.Popen]:
    port = free_port()
    named = ("--model", model) if model else ()
    kv = ("--kv-blocks", str(kv_blocks)) if kv_blocks is not None else ()
    process = floorguard("emulate", "--slots", str(slots), "--port", str(port), *named, *kv)
    _listening(port, process)
    return f"http://127.0.0.1:{port}", process


def serve(
    config: dict[str, Any],
    path: Path,
    stderr: IO[bytes] | None = None,
    max_files: int | None = None,
) -> tuple[str, subprocess.Popen]:
    """`floorguard serve` on a free port with `config` (written to `path`)."""
    port = free_port()
    path.write_text(yaml.safe_dump({**config, "port": port}))
    process = floorguard("serve", "--config", str(path), stderr=stderr, max_files=max_files)
    _listening(port, process)
    return f"http://127.0.0.1:{port}", process


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)
