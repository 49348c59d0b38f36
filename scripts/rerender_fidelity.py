"""Re-render the real-backend section of a results file from a run's saved rows, without
running the backend again (after the fidelity table's columns or sentences change).

    python scripts/rerender_fidelity.py OUT RESULTS_MD WALL_S URL MODEL E1 E3 ... [--quick]

OUT is the run's `--out` folder (its `profile.yaml` and each experiment's
`real_runs.jsonl` / `sim_runs.jsonl`); WALL_S, URL and MODEL are the run's, as its section
said, and a trailing `--quick` or `--reps N` is the run's too (for the command the section
names). E21 goes to its own section. Every figure stays the run's: only the tables' code is
today's.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from floorguard.experiments.catalogue import catalogue
from floorguard.experiments.fidelity import RealResult, fidelity_table
from floorguard.experiments.real import RealBackend, write_fidelity


def main(out: str, results_md: str, wall_s: str, url: str, model: str, *rest: str) -> None:
    folder = Path(out)
    backend = RealBackend.from_profile(url, model, folder / "profile.yaml")
    experiments = catalogue()
    first_flag = next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))
    ids, flags = rest[:first_flag], rest[first_flag:]
    results = []
    for eid in ids:
        experiment = experiments[eid]
        rows = {
            side: [json.loads(line) for line in (folder / eid / f"{side}_runs.jsonl").open()]
            for side in ("real", "sim")
        }
        memory = [r for r in rows["real"] if r.get("workload") == "kv-pressure"]
        if memory:  # the cache the backend reported, as the run's rows hold it in its blocks
            block = int(memory[0]["kv_block_tokens"])
            backend = replace(
                backend, kv_tokens=int(memory[0]["kv_blocks"]) * block, kv_block_tokens=block
            )
        table = fidelity_table(experiment, rows["real"], rows["sim"])
        results.append(RealResult(experiment, rows["real"], rows["sim"], table))
    command = " ".join(
        ["floorguard experiment run", *ids, "--backend", url, "--model", model, *flags]
    )
    write_fidelity(
        results,
        backend,
        out=folder,
        command=command,
        wall_s=float(wall_s),
        results_md=Path(results_md),
        console=Console(stderr=True),
    )
    print(f"re-rendered the real-backend section of {results_md} from {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
