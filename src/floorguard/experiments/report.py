"""`report.md` for a run: every experiment's caption, table, figures and a reading generated
from its numbers."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from floorguard.experiments.runner import ExperimentResult

__all__ = ["write_report"]


def _section(result: ExperimentResult, base: Path, figure_dir: Path, inline: bool) -> str:
    e = result.experiment
    lines = [f"## {e.id}: {e.title}", "", e.caption, ""]
    if inline:
        lines += [result.table_md, ""]
    else:
        folder = Path(e.id)
        lines += [
            f"Table: [{folder}/table.md]({folder}/table.md) · runs: "
            f"[{folder}/runs.csv]({folder}/runs.csv) ({len(result.rows)} runs, "
            f"{result.wall_s:.1f} s of worker time)",
            "",
        ]
    for figure in result.figures:
        target = figure_dir / figure.name
        if target.resolve() != figure.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(figure, target)
        lines += [f"![{e.id}]({target.relative_to(base).as_posix()})", ""]
    if e.reading is not None:
        lines += ["**Reading.** " + e.reading(result.rows), ""]
    return "\n".join(lines)


def write_report(
    results: Sequence[ExperimentResult],
    path: Path,
    *,
    title: str,
    preamble: str = "",
    inline_tables: bool = False,
    figure_dir: Path | None = None,
) -> Path:
    base = path.parent
    figure_dir = figure_dir or base
    sections = [_section(r, base, figure_dir, inline_tables) for r in results]
    path.write_text("\n".join([f"# {title}", "", preamble, "", *sections]))
    return path
