"""What every command shares: a value printed as JSON or for people."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

__all__ = ["fmt", "print_result"]


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
