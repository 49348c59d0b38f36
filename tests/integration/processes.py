"""`floorguard` subprocesses for tests that need real processes (signals, crashes)."""

from __future__ import annotations

import queue
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import yaml

STARTED: list[subprocess.Popen] = []
"""Every process `floorguard()` started, so a fixture can kill what a failed test left
running (tests/integration/conftest.py): a replica left behind keeps renewing its leases
and disturbs the fleet tests after it."""


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
        stdout=subprocess.PIPE,
        stderr=stderr,
        preexec_fn=limit if max_files is not None else None,  # noqa: PLW1509
    )
    STARTED.append(process)
    return watch(process)


def watch(process: subprocess.Popen) -> subprocess.Popen:
    """Read `process`'s stdout (a pipe) in a thread, for `listening`."""
    said: queue.Queue[list[str]] = queue.Queue()
    _SAID[process.pid] = said
    threading.Thread(target=_read_stdout, args=(process, said), daemon=True).start()
    return process


_SAID: dict[int, queue.Queue[list[str]]] = {}
"""Per process started: the URLs of each stdout line that says where it listens."""
_WHERE: dict[int, list[str]] = {}
"""Per process: where it said it listens, once asked (`listening`)."""
_ON = re.compile(r" on (https?://[^\s,()\"]+)(?: \(admin on (http://[^\s,()\"]+)\))?")
"""… in a text line or a JSON one (`log_format: json`: the URL ends the quoted message)."""


def _read_stdout(process: subprocess.Popen, said: queue.Queue[list[str]]) -> None:
    """Echo the process's stdout (never left to fill its pipe), noting the URLs of each
    line that says where it listens (`… on http://host:port`, the port it bound)."""
    assert process.stdout is not None
    with process.stdout:  # closed at its end (the process exited)
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            sys.stdout.write(line)
            found = _ON.search(line)
            if found:
                said.put([url for url in found.groups() if url])


def listening(process: subprocess.Popen, timeout_s: float = 30.0) -> list[str]:
    """Where `process` says it listens, once it does (its URLs: the server's, then the
    admin's if it has one); the process is killed if it exits or never says so (its caller
    gets no handle to stop it with). Servers here bind port 0 and report the port."""
    if process.pid in _WHERE:
        return _WHERE[process.pid]
    deadline = time.monotonic() + timeout_s
    said = _SAID[process.pid]
    try:
        while True:
            try:
                _WHERE[process.pid] = said.get(timeout=0.1)
                return _WHERE[process.pid]
            except queue.Empty:
                if process.poll() is not None:
                    raise RuntimeError(f"process exited with {process.returncode}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("it never said where it listens") from None
    except BaseException:
        stop(process)
        raise


def emulate(
    slots: int = 4, model: str | None = None, kv_blocks: int | None = None
) -> tuple[str, subprocess.Popen]:
    named = ("--model", model) if model else ()
    kv = ("--kv-blocks", str(kv_blocks)) if kv_blocks is not None else ()
    process = floorguard("emulate", "--slots", str(slots), "--port", "0", *named, *kv)
    return listening(process)[0], process


def serve(
    config: dict[str, Any],
    path: Path,
    stderr: IO[bytes] | None = None,
    max_files: int | None = None,
) -> tuple[str, subprocess.Popen]:
    """`floorguard serve` with `config` (written to `path`) on the port the system gives
    (`port: 0`, unless `config` names one)."""
    path.write_text(yaml.safe_dump({"port": 0, **config}))
    process = floorguard("serve", "--config", str(path), stderr=stderr, max_files=max_files)
    return listening(process)[0], process


def refused_start(config: dict[str, Any], path: Path, timeout_s: float = 60) -> str:
    """`floorguard serve` with `config` (written to `path`, `port: 0`), which must exit
    non-zero: what it said on stderr (also beside `path`, as `<name>.err`)."""
    path.write_text(yaml.safe_dump({"port": 0, **config}))
    err_path = path.with_suffix(".err")
    with err_path.open("wb") as err:
        process = floorguard("serve", "--config", str(path), stderr=err)
        try:
            assert process.wait(timeout_s) != 0
        finally:
            stop(process)
    return err_path.read_text()


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)
