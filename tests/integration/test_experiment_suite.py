"""`floorguard experiment run all --quick` as a smoke test: every output exists and is well
formed. Values are the experiments' business, not this test's."""

from __future__ import annotations

import csv
import json
import re

import pytest

from floorguard.cli import main

# docs/design.md §10's E1–E19, E20 (§15), E21, E22 (§16)
DESIGN_IDS = [f"E{i}" for i in range(1, 24)]
FIGURES = [
    "e1_completion_vs_arrival.png",
    "e3_priority_vs_fifo.png",
    "e7_operating_region.png",
    "e12_cv_vs_miss.png",
    "e13_attainment_vs_phase.png",
    "e17_screen_predicted_vs_measured.png",
    "e18_screen_precision_vs_calibration.png",
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("experiments")
    results = out / "results.md"
    assert (
        main(
            ["experiment", "run", "all", "--quick", "--out", str(out), "--results-md", str(results)]
        )
        == 0
    )
    return out, results


def test_every_experiment_wrote_a_tidy_table(quick_run):
    """One folder per experiment of docs/design.md §10 with runs.csv (one row per run, as
    many as runs.jsonl), table.md with a Markdown table."""
    out, _ = quick_run
    for experiment_id in DESIGN_IDS:
        folder = out / experiment_id
        with (folder / "runs.csv").open() as f:
            rows = list(csv.DictReader(f))
        lines = (folder / "runs.jsonl").read_text().splitlines()
        assert rows and len(rows) == len(lines), experiment_id
        assert {"policy", "seed", "rep", "a_offered", "a_late", "attainment"} <= rows[0].keys()
        assert all(json.loads(line)["phase_counts"] for line in lines)
        table = (folder / "table.md").read_text()
        assert table.startswith(f"# {experiment_id}:") and "\n|---|" in table


def test_figures_are_real_pngs(quick_run):
    """The five required figures exist and are PNG files with content."""
    out, _ = quick_run
    for name in FIGURES:
        matches = list(out.rglob(name))
        assert matches, name
        data = matches[0].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_report_links_resolve_and_every_experiment_has_a_reading(quick_run):
    """report.md links every table and figure that exists, with a reading per experiment."""
    out, results = quick_run
    report = (out / "report.md").read_text()
    for target in re.findall(r"\]\(([^)]+)\)", report):
        assert (out / target).is_file(), target
    assert report.count("**Reading.**") == len(DESIGN_IDS)
    inline = results.read_text()
    for target in re.findall(r"!\[[^]]*\]\(([^)]+)\)", inline):
        assert (results.parent / target).is_file(), target
    assert all(f"## {i}:" in inline for i in DESIGN_IDS)
