"""`report.md` for a run: every experiment's caption, table, figures and a reading generated
from its numbers."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from floorguard.analysis.metrics import UNMET_TEXT
from floorguard.experiments.runner import ExperimentResult, run_experiments
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize

__all__ = ["run_suite", "write_real_section", "write_report"]


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


HOW_TO_READ = f"""\
How to read the tables: **A** is the assured class (A95), **O** the opportunistic one (A10).
*miss* = late / admitted, {UNMET_TEXT}. Counts
pool the runs of one condition, never across conditions. *A miss* carries a request-level
Wilson 95 % interval, optimistic because requests within a run are correlated; *runs with 0
late* carries the run-level Clopper–Pearson 95 % interval (the run is the replication unit).
*floor attainment* = entitled ∧ admitted ∧ on time / entitled, with the entitled set taken from
the contract's own windows; *worst-phase* recomputes it with the window origin shifted by
φ ∈ [0, W). *§6 region*: whether every run of the condition satisfied design §6's assumptions
(ρ_a ≤ 1, d ≥ s_max·(1 + ⌈B/C⌉), no service above s_max, max Q_A ≤ B).
"""


def guarantee_summary(results: Sequence[ExperimentResult]) -> str:
    """Where the guard's guarantee region ends, computed over every guard condition."""
    inside = outside = inside_late = outside_held = 0
    late_in: dict[str, int] = {}
    for result in results:
        for s in summarize(result.rows):
            if s["policy"] != "guard":
                continue
            late = s["a_late"] > 0
            if s["inside_region"]:
                inside += 1
                inside_late += late
            else:
                outside += 1
                outside_held += not late
            if late:
                late_in[result.experiment.id] = late_in.get(result.experiment.id, 0) + 1
    runs = [
        r
        for result in results
        for r in result.rows
        if r["policy"] == "guard" and r["capacity_action"] == "alarm"
    ]
    admitted = sum(r["entitled_admitted"] for r in runs)
    entitled = sum(r["entitled"] for r in runs)
    where = ", ".join(f"{k} ({n})" for k, n in late_in.items()) or "none"
    return (
        f"**Where the guarantee ends.** Over all {inside + outside} guard conditions in this run, "
        f"{inside} lie inside design §6's region and {inside_late} of those had a late assured "
        f"request. Of the {outside} outside it, {outside_held} still had none: the §6 bound is "
        f"sufficient, not necessary. Guard conditions with late assured requests, by experiment "
        f"(count): {where}. AF held throughout: across the {len(runs)} guard runs without a "
        f"lowered floor, {admitted} of {entitled} floor-entitled requests were admitted."
    )


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
    head = [f"# {title}", "", preamble, "", HOW_TO_READ, guarantee_summary(results), ""]
    kept = _real_sections(path.read_text()) if path.exists() else ""
    path.write_text("\n".join([*head, *sections]) + (f"\n{kept}\n" if kept else ""))
    return path


REAL_BEGIN = "<!-- real-backend results: begin (floorguard experiment run --backend) -->"
REAL_END = "<!-- real-backend results: end -->"


def _markers(key: str) -> tuple[str, str]:
    """The markers of the real-backend section `key` ('' for E1–E8's, E21 for its own)."""
    if not key:
        return REAL_BEGIN, REAL_END
    return (
        f"<!-- real-backend results {key}: begin (floorguard experiment run {key} --backend) -->",
        f"<!-- real-backend results {key}: end -->",
    )


def _real_section(text: str, key: str = "") -> str:
    begin, end_marker = _markers(key)
    start, end = text.find(begin), text.find(end_marker)
    return text[start : end + len(end_marker)] if 0 <= start < end else ""


def _real_sections(text: str) -> str:
    """Every real-backend section of `text`, first to last (the simulator's report keeps
    them)."""
    start, end = text.find("<!-- real-backend results"), text.rfind(": end -->")
    return text[start : end + len(": end -->")] if 0 <= start < end else ""


def write_real_section(path: Path, body: str, key: str = "") -> Path:
    """Put `body` between the markers of real-backend section `key` of `path` (replacing
    what was there, or appended); the simulator's report keeps the sections when it
    rewrites the file."""
    begin, end = _markers(key)
    section = f"{begin}\n{body}\n{end}"
    text = path.read_text() if path.exists() else ""
    old = _real_section(text, key)
    text = text.replace(old, section) if old else text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    return path


def run_suite(
    experiments: Sequence[Experiment],
    *,
    out: Path,
    reps: int | None,
    quick: bool,
    workers: int | None,
    results_md: Path | None,
    command: str,
    console: Console,
) -> list[ExperimentResult]:
    """`floorguard experiment run …` on the simulator: run, then write `OUT/report.md` (and
    the full report with inline tables at `results_md`), each saying how it was made."""
    started = time.perf_counter()
    results = run_experiments(
        experiments, out=out, reps=reps, quick=quick, workers=workers, console=console
    )
    wall_s = time.perf_counter() - started
    preamble = (
        f"Generated by `{command}` in {wall_s:.0f} s wall time on "
        f"{os.cpu_count()} cores (all on the simulator). Every table and reading below comes "
        "from that run; rerun the command to regenerate this file."
    )
    report = write_report(
        results, out / "report.md", title="floorguard experiments", preamble=preamble
    )
    console.print(
        f"wrote {report} ({len(results)} experiments, "
        f"{sum(len(r.rows) for r in results)} runs, {wall_s:.1f} s)"
    )
    if results_md is not None:
        write_report(
            results,
            results_md,
            title="Results",
            preamble=preamble,
            inline_tables=True,
            figure_dir=results_md.parent / "figures",
        )
        console.print(f"wrote {results_md}")
    return results
