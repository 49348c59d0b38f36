"""The figures docs/http.md ("The KV cache") quotes: `kv_pressure()` on the simulator, slot-only
dispatch against the guard's KV budget, per seed: vLLM-style preemptions, and the floor's
entitled requests that completed late. Run: python scripts/kv_pressure.py [SEEDS]"""

from __future__ import annotations

import sys

from floorguard.analysis.records import fold_trace
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import ASSURED_TENANT, kv_pressure


def main(seeds: int = 3) -> None:
    print("seed | dispatch | preemptions (the floor tenant's) | entitled | entitled late")
    for seed in range(seeds):
        for name, budget in (("slots only", False), ("KV budget", True)):
            run = simulate_once(kv_pressure(budget=budget), seed=seed)
            records = [r for r in fold_trace(run.events or []).records if r.entitled]
            late = sum(r.outcome == "completed" and r.ended_at > r.deadline_at for r in records)
            mine = run.preempted.get(ASSURED_TENANT, 0)
            print(f"{seed} | {name} | {run.preemptions} ({mine}) | {len(records)} | {late}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
