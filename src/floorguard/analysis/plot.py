"""The one matplotlib entry every figure goes through: a `Figure` without pyplot. matplotlib
is imported when a figure is drawn, never at import: it needs a writable cache directory,
which a read-only container (`serve`, `--version`) has not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["subplots"]


def subplots(*grid: int, figsize: tuple[float, float], **kwargs: Any) -> tuple[Figure, Any]:
    """A figure and its axes, without pyplot (no global state, no backend to choose: a
    `Figure` saves through Agg)."""
    from matplotlib.figure import Figure  # noqa: PLC0415 (only when drawing: module docstring)

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)
