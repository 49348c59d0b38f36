"""The core and the simulator, old tree against this one, in ONE process (the machine's
speed swings by 2× over minutes; alternating in one process is what compares).

    git worktree add /tmp/old <rev>
    python scripts/ab_core.py /tmp/old/src [ROUNDS]

The old tree is copied as a package named `floorguard_old` (imports rewritten) beside the
installed `floorguard`. Both sides do the same work: the marquee's arrivals (Poisson assured,
as every tree can build it) for 300 s, served on one service profile (the old tree's v100-moe
values: every tree's backend runs them the same way), and the script first checks that both
sides end every request alike. Per round and side: the decision loop (arrival, poll,
completion per request through a bare Guard, µs per request), and `simulate_once` without
and with the trace (ms). Then `bench sim`'s own workload, each tree's own marquee: that
one is NOT the same work where the trees' backend models differ (it prints whether they do).
CPU time (`process_time`); min, first quartile and median printed.

    python scripts/ab_core.py /tmp/old/src --instructions

counts instructions instead of seconds (valgrind's callgrind, which a busy machine does not
disturb: the same count to 0.01 % run after run, with ASLR off and a fixed hash seed). Each
side and figure runs in a child process under callgrind, collecting only inside `exec` (the
measured runs, plus imports, which cancel out): instructions per request = (count with two
runs − count with one) ÷ requests.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DURATION_S = 300.0
SHARED_PROFILE_FIELDS = (
    "prefill_s",
    "step_1_s",
    "step_full_s",
    "coupling_shape",
    "reference_slots",
    "jitter_mean",
    "jitter_cap",
    "coupled",
)
"""The service-profile fields both trees have (not `profiles._FIELDS`, the profile file's
keys): the shared profile is built from these in each tree's own `ServiceProfile`."""


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


def _module(pkg: str, name: str) -> Any:
    return importlib.import_module(f"{pkg}.{name}")


def _profiles_module(pkg: str) -> Any:
    try:
        return _module(pkg, "profiles")
    except ModuleNotFoundError:  # before the redesign: sim/profiles.py
        return _module(pkg, "sim.profiles")


class Side:
    """One tree: its Guard, learner and simulator, on the shared workload and profile."""

    def __init__(self, pkg: str, reference: Any) -> None:
        self.guard_cls = _module(pkg, "core.guard").Guard
        self.admit = _module(pkg, "learners.adversaries").AlwaysAdmit
        self.simulate = _module(pkg, "sim.run").simulate_once
        marquee = _module(pkg, "sim.scenarios").marquee
        own = marquee(duration_s=DURATION_S)
        self.own = own
        poisson = (
            {"assured_poisson": True}
            if "assured_poisson" in inspect.signature(marquee).parameters
            else {}
        )
        profile_cls = type(own.profile)
        envelope_cls = type(own.profile.ceiling)
        fields = {f: getattr(reference, f) for f in SHARED_PROFILE_FIELDS}
        profile = profile_cls(
            name="ab-shared",
            ceiling=envelope_cls(reference.ceiling.base_s, reference.ceiling.per_token_s),
            **fields,
        )
        self.scenario = dataclasses.replace(
            marquee(duration_s=DURATION_S, **poisson), profile=profile
        )
        build = _module(pkg, "sim.workloads").build_requests
        self.requests = build(self.scenario.streams, np.random.default_rng(0).spawn(3)[0])


def _decision_us(side: Side) -> float:
    guard = side.guard_cls(side.scenario.guard_config(), learner=side.admit())
    one_call = not hasattr(
        guard, "on_complete"
    )  # the tree's own terminal call (since leases moved into the core)
    started = time.process_time()
    for r in side.requests:
        now = r.arrival_at
        guard.on_arrival(r, now)
        for d in guard.poll(now):
            if len(d) > 3:  # a Dispatch (a Drop has 3 fields)
                if one_call:
                    guard.finish(d.request.request_id, now, "complete")
                else:
                    guard.on_complete(d.request.request_id, now)
    return (time.process_time() - started) / len(side.requests) * 1e6


def _sim_ms(side: Side, record: bool, own: bool = False) -> float:
    started = time.process_time()
    side.simulate(side.own if own else side.scenario, seed=0, record=record)
    return (time.process_time() - started) * 1e3


def _outcomes(side: Side) -> list[tuple[Any, ...]]:
    run = side.simulate(side.scenario, seed=0, record=True)
    return [
        (e.kind.value, e.request_id, round(e.at, 9), e.backend)
        for e in run.events
        if e.kind.value != "config"
    ]


def _same_work(old: Side, new: Side) -> None:
    arrivals = [
        [(r.tenant, round(r.arrival_at, 12), r.num_output_tokens) for r in s.requests]
        for s in (old, new)
    ]
    if arrivals[0] != arrivals[1]:
        sys.exit("the two trees build different arrivals: not the same work")
    if _outcomes(old) != _outcomes(new):
        sys.exit("the two trees' decision logs differ on the shared workload: not the same work")
    print(f"same work: {len(new.requests)} requests, identical decision logs on both sides")


FIGURES: dict[str, Any] = {
    "decision µs": _decision_us,
    "sim ms": lambda s: _sim_ms(s, False),
    "sim+trace ms": lambda s: _sim_ms(s, True),
    "bench-sim own marquee ms": lambda s: _sim_ms(s, False, own=True),
}


def _sides(old_root: str) -> dict[str, Side]:
    sys.path.insert(0, old_root)
    reference = _profiles_module("floorguard_old").V100_MOE
    return {"old": Side("floorguard_old", reference), "new": Side("floorguard", reference)}


def _child(old_root: str, name: str, figure: str, runs: str) -> None:
    """Under callgrind: one warm run, then `runs` measured inside `exec`."""
    side = _sides(old_root)[name]
    measure = FIGURES[figure]
    measure(side)
    exec("for _ in range(int(runs)): measure(side)")


def _instructions(old_root: str, name: str, figure: str, runs: int) -> int:
    out = subprocess.run(
        ["setarch", "-R", "valgrind", "--tool=callgrind", "--toggle-collect=builtin_exec",
         "--callgrind-out-file=/dev/null", sys.executable, __file__, "--child", old_root,
         name, figure, str(runs)],
        env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    return int(re.search(r"Collected : (\d+)", out).group(1))  # type: ignore[union-attr]


def instructions_main(old_root: str) -> None:
    sides = _sides(old_root)
    _same_work(sides["old"], sides["new"])
    for figure in FIGURES:
        per: dict[str, float] = {}
        for name, side in sides.items():
            own = figure.startswith("bench-sim")
            n = (
                side.simulate(side.own, seed=0, record=False).num_requests
                if own
                else len(side.requests)
            )
            runs = [_instructions(old_root, name, figure, k) for k in (1, 2)]
            per[name] = (runs[1] - runs[0]) / n
        print(
            f"{figure.split(' ')[0]} (instructions per request): old {per['old']:,.0f} "
            f"new {per['new']:,.0f} new/old {per['new'] / per['old']:.4f}"
        )


def main(old_src: str, rounds: str = "20") -> None:
    old_root = str(_copy_as_old(Path(old_src)))
    if rounds == "--instructions":
        instructions_main(old_root)
        return
    sides = _sides(old_root)
    _same_work(sides["old"], sides["new"])
    own_same = sides["old"].own.profile.step_s(4) == sides["new"].own.profile.step_s(4)
    print(
        "bench sim's own marquee: "
        + (
            "the same backend model in both trees"
            if own_same
            else "the trees' v100-moe models differ (not the same work; shown for the record)"
        )
    )
    figures = FIGURES
    seen: dict[str, list[float]] = {}
    for i in range(int(rounds)):
        for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
            for figure, measure in figures.items():
                seen.setdefault(f"{figure} {name}", []).append(measure(sides[name]))
    for figure in figures:
        old, new = sorted(seen[f"{figure} old"]), sorted(seen[f"{figure} new"])
        q1, med = len(old) // 4, len(old) // 2
        print(
            f"{figure}: old min {old[0]:.2f} q1 {old[q1]:.2f} median {old[med]:.2f} | "
            f"new min {new[0]:.2f} q1 {new[q1]:.2f} median {new[med]:.2f} | new/old min "
            f"{new[0] / old[0]:.3f} q1 {new[q1] / old[q1]:.3f} median {new[med] / old[med]:.3f}"
        )


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        _child(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
