"""The import graph follows docs/architecture.md's layer list: every `floorguard` import (at
module level or inside a function) points down the list or stays on its line, and inside
`proxy/` down its folders' order. The list is read from the doc itself, so the doc and the
code cannot drift apart silently."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "floorguard"
UNLISTED = {"__init__", "_compiled"}
"""The package's own `__init__` (it selects the build) and `_compiled` (setup.py imports it
by path; it imports nothing of floorguard)."""


def layers(doc: str) -> tuple[dict[str, int], dict[str, int]]:
    """The ranks the doc's block gives (0: the top): of each top-level name, and of each
    folder of `proxy/` (its `a/ → b/ → …` line)."""
    block = doc.split("## Layers", 1)[1].split("```", 2)[1]
    ranks: dict[str, int] = {}
    inner: dict[str, int] = {}
    for line in block.splitlines():
        if "→" in line and line.startswith(" "):
            inner = {name: i for i, name in enumerate(re.findall(r"([a-z_]+)/", line))}
            continue
        names = re.match(r"^((?:[a-z_]+(?:/|\.py)\s+)+)", line)
        if names:
            rank = len(set(ranks.values()))
            for name in names.group(1).split():
                ranks[name.removesuffix("/").removesuffix(".py")] = rank
    return ranks, inner


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str) -> list[str]:
    """Every absolute `floorguard.*` module a source imports, wherever it does."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name.startswith("floorguard.")]


def upward(module: str, source: str, ranks: dict[str, int], inner: dict[str, int]) -> list[str]:
    """`module`'s imports that point up the list (or up `proxy/`'s folders)."""
    parts = module.split(".")
    bad = []
    for target in imports(source):
        other = target.split(".")
        if other[1] in UNLISTED:
            continue  # below everything: it imports nothing of floorguard
        folders = parts[1] == other[1] == "proxy" and len(parts) > 3 and len(other) > 3
        if ranks[other[1]] < ranks[parts[1]] or (folders and inner[other[2]] < inner[parts[2]]):
            bad.append(target)
    return bad


def test_every_import_points_down_the_layer_list():
    ranks, inner = layers((ROOT / "docs" / "architecture.md").read_text())
    assert set(inner) == {p.name for p in (PACKAGE / "proxy").iterdir() if p.is_dir()} - {
        "__pycache__"
    }
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        parts = module.split(".")
        if len(parts) == 1 or parts[1] in UNLISTED:
            continue
        assert parts[1] in ranks, f"{module}: not in docs/architecture.md's layer list"
        violations += [f"{module} → {t}" for t in upward(module, path.read_text(), ranks, inner)]
    assert violations == []


def test_the_check_catches_an_import_up_the_list():
    ranks, inner = layers((ROOT / "docs" / "architecture.md").read_text())
    core = "def f():\n    from floorguard.proxy.edge.replies import json_error\n"
    assert upward("floorguard.core.guard", core, ranks, inner) == ["floorguard.proxy.edge.replies"]
    config = "from floorguard.proxy.edge.normalize import EdgeLimits\n"
    assert upward("floorguard.proxy.config.sections", config, ranks, inner) == [
        "floorguard.proxy.edge.normalize"
    ]
    same_line = "from floorguard.sim.probe import latency_model_for\n"
    assert upward("floorguard.screen.model", same_line, ranks, inner) == []


CLOCK_CALLS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "sleep"),
    ("asyncio", "sleep"),
}
"""Direct clock reads and sleeps: the drivers in `proxy/` and `store/` take a clock instead
(`floorguard.clock`), so they run on a `ManualClock` in tests (design §18.1)."""


def clock_calls(source: str) -> list[str]:
    return [
        f"{node.func.value.id}.{node.func.attr}() at line {node.lineno}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr) in CLOCK_CALLS
    ]


def test_the_drivers_read_time_only_through_their_clock():
    found = [
        f"{path.relative_to(PACKAGE)}: {call}"
        for folder in ("proxy", "store")
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for call in clock_calls(path.read_text())
    ]
    assert found == []
    assert clock_calls("import time\nstarted = time.monotonic()\n") == [
        "time.monotonic() at line 2"
    ]
