"""The core and the simulator, old tree against this one, in ONE process (the machine's
speed swings by 2× over minutes; alternating in one process is what compares).

    git worktree add /tmp/old <rev>
    python scripts/ab_core.py /tmp/old/src [ROUNDS]

The old tree is copied as a package named `floorguard_old` (imports rewritten) beside the
installed `floorguard`. Per round and side: the decision loop (arrival, poll, completion per
request through a bare Guard, µs per request), and `simulate_once` of a 300 s marquee without
and with the trace (ms). CPU time (`process_time`); min, first quartile and median printed.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _copy_as_old(src: Path) -> Path:
    root = Path(tempfile.mkdtemp())
    target = root / "floorguard_old"
    shutil.copytree(src / "floorguard", target)
    for path in target.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfloorguard\.", "floorguard_old.", text)
        text = text.replace("from floorguard import", "from floorguard_old import")
        path.write_text(text)
    return root


def _load(pkg: str) -> tuple[Any, ...]:
    guard = importlib.import_module(pkg + ".core.guard").Guard
    admit = importlib.import_module(pkg + ".learners.adversaries").AlwaysAdmit
    scenario = importlib.import_module(pkg + ".sim.scenarios").marquee(duration_s=300)
    build = importlib.import_module(pkg + ".sim.workloads").build_requests
    simulate = importlib.import_module(pkg + ".sim.run").simulate_once
    requests = build(scenario.streams, np.random.default_rng(0).spawn(3)[0])
    return guard, admit, scenario, requests, simulate


def _decision_us(side: tuple[Any, ...]) -> float:
    guard_cls, admit, scenario, requests, _ = side
    guard = guard_cls(scenario.guard_config(), learner=admit())
    started = time.process_time()
    for r in requests:
        now = r.arrival_at
        guard.on_arrival(r, now)
        for d in guard.poll(now):
            if len(d) == 5:  # a Dispatch (a Drop has 3 fields)
                guard.on_complete(d.request.request_id, now)
    return (time.process_time() - started) / len(requests) * 1e6


def _sim_ms(side: tuple[Any, ...], record: bool) -> float:
    _, _, scenario, _, simulate = side
    started = time.process_time()
    simulate(scenario, seed=0, record=record)
    return (time.process_time() - started) * 1e3


def main(old_src: str, rounds: str = "20") -> None:
    sys.path.insert(0, str(_copy_as_old(Path(old_src))))
    sides = {"old": _load("floorguard_old"), "new": _load("floorguard")}
    seen: dict[str, list[float]] = {}
    for i in range(int(rounds)):
        for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
            side = sides[name]
            seen.setdefault(f"decision µs {name}", []).append(_decision_us(side))
            seen.setdefault(f"sim ms {name}", []).append(_sim_ms(side, False))
            seen.setdefault(f"sim+trace ms {name}", []).append(_sim_ms(side, True))
    for figure in ("decision µs", "sim ms", "sim+trace ms"):
        old, new = sorted(seen[f"{figure} old"]), sorted(seen[f"{figure} new"])
        q1, med = len(old) // 4, len(old) // 2
        print(
            f"{figure}: old min {old[0]:.2f} q1 {old[q1]:.2f} median {old[med]:.2f} | "
            f"new min {new[0]:.2f} q1 {new[q1]:.2f} median {new[med]:.2f} | new/old min "
            f"{new[0] / old[0]:.3f} q1 {new[q1] / old[q1]:.3f} median {new[med] / old[med]:.3f}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
