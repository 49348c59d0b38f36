"""`floorguard init`: a starter configuration for one backend, with the guard's own API keys
(docs/quickstart.md). It writes the file and says the next commands; it never overwrites a
file unless told."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from floorguard.errors import FloorguardError

__all__ = ["register", "run", "starter_config"]

_TEMPLATE = """\
# A starter floorguard configuration (`floorguard init`). Every key: docs/config.md.
port: {port}
backends:
  - url: {backend}   # vLLM's OpenAI-compatible server (or `floorguard emulate`)
    slots: {slots}   # its --max-num-seqs: never more than this in flight there
window_s: 1.0        # the floor's window W
contracts:
  # {tenant}: {floor} requests reserved in every window, admitted whatever the learner says;
  # past that, served while a slot is free (excess_policy: spare)
  - tenant: {tenant}
    class: assured
    floor: {floor}
    deadline_ms: {deadline_ms}
  # {surplus}: served from what the floor leaves
  - tenant: {surplus}
    class: opportunistic
    deadline_ms: {deadline_ms}
identity:
  mode: api_key      # the guard's own keys: floorguard keys create <tenant> --file …
  api_keys_file: {keys}
decision_log: {log}  # floorguard verify {log}
# profile: the service model for the deadlines; `floorguard calibrate --backend … --out
# profile.yaml` measures yours (docs/vllm.md). The default is a shipped one.
"""


def register(commands: Any) -> None:
    init = commands.add_parser("init", help="write a starter config for one backend")
    init.add_argument("--backend", required=True, help="the backend's base URL (vLLM, …)")
    init.add_argument("--slots", type=int, default=4, help="its --max-num-seqs (C)")
    init.add_argument("--out", type=Path, default=Path("guard.yaml"), help="the config file")
    init.add_argument(
        "--keys", type=Path, default=Path("guard-keys.json"), help="the API keys file it names"
    )
    init.add_argument("--port", type=int, default=8080, help="where the guard will listen")
    init.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    init.set_defaults(run=run)


def starter_config(backend: str, slots: int, keys: Path, port: int, log: Path) -> str:
    """The starter configuration's YAML (its comments included)."""
    if not backend.startswith(("http://", "https://")):
        raise FloorguardError(f"--backend {backend!r}: an http:// or https:// URL")
    if slots < 1:
        raise FloorguardError(f"--slots {slots}: at least 1")
    return _TEMPLATE.format(
        port=port,
        backend=backend,
        slots=slots,
        tenant="acme",
        surplus="free",
        floor=max(1, slots // 2),
        deadline_ms=20000,
        keys=keys,
        log=log,
    )


def run(args: argparse.Namespace, console: Console) -> int:
    out: Path = args.out
    if out.exists() and not args.force:
        raise FloorguardError(f"{out} exists: pass --force to overwrite it")
    keys = args.keys.resolve()
    log = (out.parent / "decisions.jsonl").resolve()
    out.write_text(starter_config(args.backend, args.slots, keys, args.port, log))
    console.print(f"wrote {out}", markup=False)
    console.print(
        "next:\n"
        f"  floorguard keys create acme --file {keys} --config {out}\n"
        f"  floorguard serve --check --config {out}\n"
        f"  floorguard serve --config {out}",
        markup=False,
    )
    return 0
