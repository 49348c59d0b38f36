"""`floorguard usage`: the access log's lines summed per tenant, model, class, status or
decision (docs/http.md, "Usage"): what each request cost, as the guard billed it
(`proxy/observe/usage.py` writes the `usage` field)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["USAGE_KEYS", "usage_report"]


USAGE_KEYS = ("tenant", "model", "class", "status", "decision")
"""What `floorguard usage --by` can group access-log lines by."""


def usage_report(
    lines: Iterable[Mapping[str, Any]],
    by: tuple[str, ...] = ("tenant", "model"),
    since: float | None = None,
) -> list[dict[str, Any]]:
    """The access log's lines (decoded) summed per group of `by`: requests, requests the
    backend reported usage for, requests billed an estimate (module docstring), prompt and
    completion tokens (estimates included); lines before `since` (a
    Unix time) left out. Sorted by the most tokens first."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for line in lines:
        if since is not None and line.get("ts", 0) < since:
            continue
        key = tuple(line.get(name) for name in by)
        row = groups.setdefault(
            key,
            {
                **dict(zip(by, key, strict=True)),
                "requests": 0,
                "reported": 0,
                "estimated": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        )
        row["requests"] += 1
        usage = line.get("usage")
        if isinstance(usage, dict):
            row["estimated" if usage.get("estimated") else "reported"] += 1
            row["prompt_tokens"] += int(usage.get("prompt_tokens", 0))
            row["completion_tokens"] += int(usage.get("completion_tokens", 0))
    return sorted(groups.values(), key=lambda r: -(r["prompt_tokens"] + r["completion_tokens"]))
