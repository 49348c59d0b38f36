"""`floorguard keys create|list|revoke`: the guard's own API keys (docs/http.md), in the
keys file a guard reads with `identity.api_keys_file`. A key is printed once, at creation;
the file keeps only its hash. A running guard sees a revocation within a second."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from floorguard.errors import FloorguardError
from floorguard.proxy.edge.api_keys import ApiKey, create_key, list_keys, revoke_key

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    keys = commands.add_parser("keys", help="issue, list and revoke the guard's API keys")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="issue a key for a tenant (printed once)")
    create.add_argument("tenant", help="the tenant the key names (it needs a contract)")
    create.add_argument(
        "--config",
        type=Path,
        help="a guard config: the tenant must have a contract there (a typo is refused, "
        "not issued a key that never works)",
    )
    create.add_argument("--label", default="", help="what the key is for (shown by list)")
    create.add_argument(
        "--expires-in",
        type=_duration,
        help="refused after this long: 90d, 12h, 30m or seconds (default: never)",
    )
    listing = actions.add_parser("list", help="the keys: id, tenant, created, revoked")
    revoke = actions.add_parser("revoke", help="revoke a key by its id (fgk_<id>_…)")
    revoke.add_argument("id", help="the key's id: the 8 hex digits after fgk_")
    for action in (create, listing, revoke):
        action.add_argument(
            "--file",
            type=Path,
            required=True,
            help="the keys file (identity.api_keys_file); created by the first create",
        )
        action.add_argument("--json", action="store_true")
    keys.set_defaults(run=run)


def _duration(text: str) -> float:
    """An argparse type: `90d`, `12h`, `30m`, `45s` or plain seconds, > 0."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration like 90d, 12h, 30m") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return seconds


def _contracted(config: Path, tenant: str) -> None:
    """A `FloorguardError` unless `tenant` has a contract in the guard config `config`."""
    from floorguard.proxy.config.guard import load_config  # noqa: PLC0415  # only with --config

    tenants = {c.tenant for c in load_config(config).contracts}
    if tenant not in tenants:
        raise FloorguardError(
            f"keys create {tenant}: no contract for it in {config}; "
            f"tenants: {', '.join(sorted(tenants))}"
        )


def _when(at: float | None) -> str:
    return "–" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def _entry(entry: ApiKey) -> dict[str, Any]:
    """What may be shown of a key: never its hash."""
    return {k: v for k, v in asdict(entry).items() if k != "sha256"}


def run(args: argparse.Namespace, console: Console) -> int:
    if args.action == "create":
        if args.config is not None:
            _contracted(args.config, args.tenant)
        now = time.time()
        expires = None if args.expires_in is None else now + args.expires_in
        key, entry = create_key(
            args.file, args.tenant, now=now, label=args.label, expires_at=expires
        )
        if args.json:
            print(json.dumps({"key": key, **_entry(entry)}))
        else:
            console.print(f"key for tenant [bold]{entry.tenant}[/] (id {entry.id}):")
            print(key)
            console.print("[dim]shown once: the file keeps only its hash[/]")
        return 0
    if args.action == "revoke":
        entry = revoke_key(args.file, args.id, now=time.time())
        if args.json:
            print(json.dumps(_entry(entry)))
        else:
            console.print(
                f"revoked {entry.id} (tenant {entry.tenant}) at {_when(entry.revoked_at)}"
            )
        return 0
    entries = list_keys(args.file)
    if args.json:
        print(json.dumps([_entry(e) for e in entries]))
        return 0
    table = Table("id", "tenant", "label", "created (UTC)", "expires (UTC)", "revoked (UTC)")
    for e in entries:
        table.add_row(
            e.id,
            e.tenant,
            e.label,
            _when(e.created_at),
            _when(e.expires_at),
            _when(e.revoked_at),
        )
    console.print(table)
    return 0
