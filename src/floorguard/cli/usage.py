"""`floorguard usage ACCESS_LOG…`: the tokens each tenant (and model) used, as the backends
reported them, summed from the guard's access log (`access_log:`)."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from floorguard.analysis.usage import USAGE_KEYS, usage_report
from floorguard.errors import ConfigError

__all__ = ["register", "run"]

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(commands: Any) -> None:
    usage = commands.add_parser(
        "usage", help="tokens per tenant and model, from the guard's access log"
    )
    usage.add_argument("log", type=Path, nargs="+", help="access log(s) (JSON lines)")
    usage.add_argument(
        "--by",
        default="tenant,model",
        help=f"group by these, comma-separated, of {', '.join(USAGE_KEYS)} (default: tenant,model)",
    )
    usage.add_argument(
        "--since",
        help="only lines from then on: an ISO time (2026-12-04T09:00, UTC unless it says) "
        "or a duration ago (90s, 15m, 6h, 7d)",
    )
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(run=run)


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    ago = _AGO.match(text)
    if ago:
        return time.time() - float(ago.group(1)) * _UNIT_S[ago.group(2)]
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError("--since", text, "not an ISO time or a duration (15m, 6h, 7d)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()


def _lines(paths: list[Path]) -> Iterator[dict[str, Any]]:
    """Each log's lines, decoded one at a time (a log of many GB is never held whole)."""
    for path in paths:
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    yield orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise ConfigError(str(path), f"line {number}", "not JSON") from None


def run(args: argparse.Namespace, console: Console) -> int:
    by = tuple(name.strip() for name in args.by.split(",") if name.strip())
    unknown = [name for name in by if name not in USAGE_KEYS]
    if unknown or not by:
        raise ConfigError("--by", args.by, f"group by any of {', '.join(USAGE_KEYS)}")
    rows = usage_report(_lines(args.log), by, _since(args.since))
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(*by, "requests", "with usage", "estimated", "prompt tokens", "completion tokens")
    for row in rows:
        table.add_row(
            *(str(row[name]) if row[name] is not None else "–" for name in by),
            str(row["requests"]),
            str(row["reported"]),
            str(row["estimated"]),
            f"{row['prompt_tokens']:,}",
            f"{row['completion_tokens']:,}",
        )
    console.print(table)
    console.print(
        "[dim]tokens as the backends reported them (`usage`); a reply that ended without "
        "it (cut, or a backend that omits usage) is billed the guard's estimate, counted "
        "under `estimated` and included in the tokens[/]"
    )
    return 0
