"""The declarative shape of an experiment: a grid of conditions × reps, how to tabulate it,
which figures to draw, and how to read it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow

__all__ = ["Experiment", "Row"]

Row = dict[str, Any]
"""A row as written (`runs.csv`): a simulated run's (read as a `RunRow`), a real one's."""


@dataclass(frozen=True)
class Experiment:
    id: str
    title: str
    caption: str
    """The parameters, including every choice made where docs/design.md §10 leaves one open."""
    grid: Callable[[bool], list[Condition]]
    """Conditions for a full run (False) or a `--quick` one (True)."""
    reps: int
    quick_reps: int = 2
    shown: tuple[str, ...] = ("policy",)
    """Condition fields that label a table row."""
    figures: tuple[Callable[[Sequence[RunRow], Path], Path], ...] = ()
    reading: Callable[[Sequence[RunRow]], str] | None = None
    extra: Callable[[Sequence[RunRow]], str] | None = None
    """Extra Markdown after the table (correlations, derived quantities)."""
    needs_data: bool = False
    """Reads ../shared/data; skipped with a note when the traces are absent."""
    params: dict[str, Any] = field(default_factory=dict)
