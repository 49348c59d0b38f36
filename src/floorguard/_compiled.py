"""Which modules the build compiles with mypyc (setup.py), and which build runs here.

The compiled modules are the same Python sources, so the two builds behave alike; only
speed differs. `select()` runs first thing in `floorguard/__init__.py`, before any of them
is imported. It runs the pure sources where

* `FLOORGUARD_PURE=1` is set (CI runs the core and property tests so), or
* a compiled module's source has changed since it was compiled (`_compiled.json`, written by
  the build, holds each source's sha256): an editable install keeps its compiled modules
  beside their sources, and Python would prefer the stale extension to the edited source.
  Compiled modules call each other natively, so it is all of them or none.

This module is imported by setup.py by path, so it imports nothing of floorguard.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED", "HASHES_FILE", "reusable", "running", "select", "source_path"]

COMPILED = (
    "floorguard.clock",
    "floorguard.windows",
    "floorguard.core.contract",
    "floorguard.core.dispatcher",
    "floorguard.core.doom",
    "floorguard.core.events",
    "floorguard.core.guard",
    "floorguard.core.learner",
    "floorguard.core.ledger",
    "floorguard.core.meter",
    "floorguard.core.monitors",
    "floorguard.core.refusals",
    "floorguard.core.request",
    "floorguard.core.stats",
    "floorguard.core.surface",
    "floorguard.sim.backend",
    "floorguard.sim.engine",
    "floorguard.sim.run",
    "floorguard.sim.serving",
    "floorguard.store.base",
    "floorguard.store.memory",
    # the HTTP guard's request path, by folder (floorguard/proxy/__init__.py)
    "floorguard.proxy.process.app",
    "floorguard.proxy.pool.pool",
    "floorguard.proxy.pool.fleet",
    "floorguard.proxy.pool.forward",
    "floorguard.proxy.pool.pump",
    "floorguard.proxy.pool.relay",
    "floorguard.proxy.pool.upstream",
    "floorguard.proxy.edge.identity",
    "floorguard.proxy.edge.normalize",
    "floorguard.proxy.edge.ratelimit",
    "floorguard.proxy.edge.replies",
    "floorguard.proxy.observe.decision_log",
    "floorguard.proxy.observe.metrics",
    "floorguard.proxy.observe.usage",
)
"""The pure decision core, the simulator's hot loop, and the HTTP guard's request path."""

HASHES_FILE = "_compiled.json"
"""Beside the compiled package: module → sha256 of the source it was compiled from."""

_state = {"running": "pure Python (not compiled)"}


def source_path(root: Path, module: str) -> Path:
    """`module`'s source under `root` (the folder that holds the `floorguard` package)."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def running() -> str:
    """Which build runs: `compiled (mypyc)`, or pure Python and why."""
    return _state["running"]


def _extensions(root: Path) -> set[str]:
    """The floorguard modules that have an extension module (compiled) beside their source."""
    found = set()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for built in (root / "floorguard").rglob("*" + suffix):
            source = built.with_name(built.name[: -len(suffix)] + ".py")
            if source.exists():
                found.add(".".join(source.relative_to(root).with_suffix("").parts))
    return found


def _stale(root: Path, built: set[str]) -> list[str]:
    """The compiled modules whose source differs from the one compiled (all, without a
    record of them), and any extension left from a build that compiled other modules."""
    try:
        recorded = json.loads((root / "floorguard" / HASHES_FILE).read_text())
    except (OSError, ValueError):
        return sorted(built)
    return sorted(built ^ set(COMPILED)) + [
        module
        for module in COMPILED
        if recorded.get(module)
        != hashlib.sha256(source_path(root, module).read_bytes()).hexdigest()
    ]


def reusable(root: Path) -> bool:
    """Whether `root` (an editable install's `src`) holds a compiled build of every module
    of `COMPILED` whose source has not changed since: `pip install -e` then reuses it
    instead of compiling again (setup.py; the README's second command after its first)."""
    built = _extensions(root)
    return built == set(COMPILED) and not _stale(root, built)


class _PureSources:
    """A meta-path finder that loads the given modules from their sources."""

    def __init__(self, root: Path, modules: set[str]) -> None:
        self.root = root
        self.modules = modules

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(self.root, fullname))


def select() -> str:
    """Decide, before any compiled module is imported, which build runs (`running()`)."""
    root = Path(__file__).resolve().parent.parent
    built = _extensions(root)
    if not built:
        return running()
    if os.environ.get("FLOORGUARD_PURE") == "1":
        _state["running"] = "pure Python (FLOORGUARD_PURE=1)"
    elif stale := _stale(root, built):
        _state["running"] = "pure Python (the compiled modules do not match their sources)"
        print(
            f"floorguard: {stale[0]} does not match the compiled build: running the pure-Python "
            "core (rebuild with `pip install -e .` to compile it again)",
            file=sys.stderr,
        )
    else:
        _state["running"] = "compiled (mypyc)"
        return running()
    sys.meta_path.insert(0, _PureSources(root, built | set(COMPILED)))
    return running()


if __name__ == "floorguard._compiled":  # imported first by floorguard/__init__.py; not by setup.py
    select()
