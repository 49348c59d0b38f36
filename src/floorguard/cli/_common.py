"""What every command shares: a value printed as JSON or for people."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

__all__ = ["fmt", "port", "print_result"]


def fmt(value: Any, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:.1%}" if percent else str(value)


def print_result(result: dict[str, Any], as_json: bool, console: Console) -> None:
    """JSON on stdout (`--json`), else pretty-printed JSON on the console."""
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        console.print_json(json.dumps(result))


def port(text: str) -> int:
    """An argparse type: a TCP port, 0–65535 (0: one the system gives, and the listening
    line names it); a clear usage error, not a bind traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: must be 0–65535")
    return value
