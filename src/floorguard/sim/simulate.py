"""`simulate`: seeded reps of one scenario and one stack, pooled into the stable
`floorguard simulate --json` contract (README)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from floorguard.analysis.metrics import RunMetrics, measure
from floorguard.analysis.records import fold_trace
from floorguard.analysis.summary import pool_runs
from floorguard.baselines.registry import StackOptions
from floorguard.core.events import write_jsonl
from floorguard.core.monitors import assumptions_of
from floorguard.errors import FloorguardError
from floorguard.learners.registry import LearnerOptions, needs_latency_model
from floorguard.sim.probe import latency_model_for
from floorguard.sim.run import SimRun, simulate_once
from floorguard.sim.scenarios import Scenario

__all__ = ["learner_options_for", "rep_seeds", "simulate", "trace_path"]


def rep_seeds(seed: int, reps: int) -> list[int]:
    """Independent per-rep seeds from one seed (common across stacks: paired comparisons)."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(reps)]


def trace_path(base: Path, rep: int, reps: int) -> Path:
    """Rep `rep`'s decision log: `base` itself for one rep, else `base-repN.jsonl`."""
    return base if reps == 1 else base.with_name(f"{base.stem}-rep{rep}{base.suffix or '.jsonl'}")


def learner_options_for(scenario: Scenario, learner: str, *, beta: float = 1.0) -> LearnerOptions:
    """β and the SLO for the predictors, with the published fit for this backend: the one
    `floorguard experiment` and `serve` use for the same profile and C
    (`sim.probe.latency_model_for`)."""
    model = None
    if needs_latency_model(learner):
        model = latency_model_for(scenario.profile, scenario.slots[0])
    return LearnerOptions(beta=beta, slo_s=scenario.slo_s, latency_model=model)


def simulate(
    scenario: Scenario,
    *,
    policy: str = "guard",
    learner: str = "always-admit",
    beta: float = 1.0,
    reps: int = 1,
    seed: int = 0,
    stack_options: StackOptions | None = None,
    trace_out: Path | None = None,
    on_rep: Callable[[], None] | None = None,
    learner_options: LearnerOptions | None = None,
) -> dict[str, Any]:
    """Run `reps` seeded reps; return the pooled summary (the `--json` contract). With
    `trace_out`, each rep's decision log is written there (`trace_path`);
    `learner_options`: the learner's as a serve config gives them (else from the
    scenario and `beta`)."""
    if reps < 1:
        raise FloorguardError(f"--reps = {reps}: must be ≥ 1")
    started = time.perf_counter()
    if learner_options is None:
        learner_options = learner_options_for(scenario, learner, beta=beta)
    runs: list[SimRun] = []
    metrics: list[RunMetrics] = []
    for rep, rep_seed in enumerate(rep_seeds(seed, reps)):
        run = simulate_once(
            scenario,
            seed=rep_seed,
            policy=policy,
            learner=learner,
            learner_options=learner_options,
            stack_options=stack_options,
        )
        assert run.events is not None
        if trace_out is not None:
            write_jsonl(run.events, str(trace_path(trace_out, rep, reps)))
        metrics.append(measure(fold_trace(run.events)))
        run.events = None  # keep the monitors, not the log
        runs.append(run)
        if on_rep is not None:
            on_rep()
    sim_wall_s = sum(r.wall_s for r in runs)
    num_requests = sum(r.num_requests for r in runs)
    model = learner_options.latency_model
    return {
        "scenario": scenario.name,
        "policy": policy,
        "learner": learner,
        "profile": scenario.profile.name,
        "seed": seed,
        "floor": scenario.guard_config().total_floor,
        "slots": scenario.slots[0],
        "deadline_ms": scenario.slo_s * 1e3,
        **pool_runs(metrics),
        "assumptions": asdict(assumptions_of(scenario.guard_config(), [r.guard for r in runs])),
        "learner_faults": sum(r.guard.stats.learner_faults for r in runs),
        "beta": beta,
        "learner_model": model.as_dict() if model is not None else None,
        "reps": reps,
        "num_requests": num_requests,
        "wall_s": time.perf_counter() - started,
        "sim_requests_per_s": num_requests / sim_wall_s if sim_wall_s > 0 else None,
    }
