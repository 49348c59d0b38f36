"""Re-render the real-backend section of a results file from a run's saved rows, without
running the backend again (after the fidelity table's columns or sentences change).

    python scripts/rerender_fidelity.py OUT RESULTS_MD WALL_S URL MODEL E1 E3 ...

OUT is the run's `--out` folder (its `profile.yaml` and each experiment's
`real_runs.jsonl` / `sim_runs.jsonl`); WALL_S, URL and MODEL are the run's, as its section
said. Every figure stays the run's: only the tables' code is today's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from floorguard.experiments.catalogue import catalogue
from floorguard.experiments.conditions import Condition
from floorguard.experiments.fidelity import RealResult, fidelity_report, fidelity_table
from floorguard.experiments.real import RealBackend, describe
from floorguard.experiments.report import write_real_section


def main(out: str, results_md: str, wall_s: str, url: str, model: str, *ids: str) -> None:
    folder = Path(out)
    backend = RealBackend.from_profile(url, model, folder / "profile.yaml")
    experiments = catalogue()
    results = []
    for eid in ids:
        experiment = experiments[eid]
        rows = {
            side: [json.loads(line) for line in (folder / eid / f"{side}_runs.jsonl").open()]
            for side in ("real", "sim")
        }
        table = fidelity_table(experiment, rows["real"], rows["sim"])
        results.append(RealResult(experiment, rows["real"], rows["sim"], table))
    command = f"floorguard experiment run {' '.join(ids)} --backend {url} --model {model}"
    body = fidelity_report(
        results,
        describe(backend, Condition()),
        command=command,
        wall_s=float(wall_s),
        figure="figures/fidelity_real_vs_sim.png",
    )
    write_real_section(Path(results_md), body)
    print(f"re-rendered the real-backend section of {results_md} from {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
