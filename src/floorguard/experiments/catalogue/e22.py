"""E22: memory pressure inside the floor's region (docs/design.md §6, §16) — E21's workload at the
deadline and window where the budget's bound holds, so a late floor request is a failure
of the dispatch, not of the setup."""

from __future__ import annotations

import math
from collections.abc import Sequence

from floorguard.core.monitors import assumption_report
from floorguard.experiments.catalogue.e21 import (
    BUDGET,
    CACHES,
    DISPATCH,
    FORWARDED,
    SERVER,
    SLOTS,
    _cell,
    _extra,
    _ms,
    _p99_ms,
    _sum,
    memory_condition,
)
from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.sim.scenarios import KV_OUTPUT_TOKENS, KV_PROMPT_TOKENS, kv_pressure

FLOOR = 1
WINDOW_S = 1.5
"""B = 1 per 1.5 s window: docs/design.md §6's A4 (ρ_a = B·s_max / (C·W) ≤ 1) holds on the two
requests the 512-token budget runs at once, with room for a backend whose long requests
cost relatively more than v100-moe's (the runner keeps W's ratio to capacity at ℓ = 16)."""


def region_deadline_ms() -> float:
    """docs/design.md §6's bound under the budget for E22's request (100 + 64 tokens) and floor, the
    larger over its caches (the shipped `assumption_report`), rounded up to 10 ms:
    `s_max(64, 100)·(1 + ⌈B/C⌉)`, C = what the cache runs at once (2 of 32 blocks, 3 of 40)."""
    bounds = []
    for blocks in CACHES:
        config = kv_pressure(kv_blocks=blocks, budget=True, floor=FLOOR, window_s=WINDOW_S)
        report = assumption_report(
            config.guard_config(),
            num_output_tokens=KV_OUTPUT_TOKENS,
            num_prompt_tokens=KV_PROMPT_TOKENS,
        )
        assert report.bound_s is not None
        bounds.append(report.bound_s)
    return math.ceil(max(bounds) * 100) * 10.0


def _e22(quick: bool) -> list[Condition]:
    deadline_ms = region_deadline_ms()
    return [
        memory_condition(
            FLOOR,
            blocks,
            d,
            window_s=WINDOW_S,
            deadline_ms=deadline_ms,
            duration_s=9.0 if quick else 15.0,
        )
        for blocks in CACHES
        for d in DISPATCH
    ]


def _reading(rows: Sequence[RunRow]) -> str:
    parts = []
    for blocks in sorted({r["kv_blocks"] for r in rows}):
        cell = (FLOOR, blocks)
        late = {d: _sum(rows, "a_late", cell, d) for d in DISPATCH}
        admitted = {d: _sum(rows, "a_admitted", cell, d) for d in DISPATCH}
        p99 = {d: _ms(_p99_ms(_cell(rows, cell, d))) for d in DISPATCH}
        pre = {d: _sum(rows, "preemptions", cell, d) for d in DISPATCH}
        budget_runs = _cell(rows, cell, BUDGET)
        inside = sum(bool(r["inside_region"]) for r in budget_runs)
        parts.append(
            f"{blocks} blocks: assured late / admitted (p99 ms, preemptions) — server priority "
            f"{late[SERVER]}/{admitted[SERVER]} ({p99[SERVER]}, {pre[SERVER]}); by slots "
            f"{late[SLOTS]}/{admitted[SLOTS]} ({p99[SLOTS]}, {pre[SLOTS]}); by slots, priority "
            f"forwarded {late[FORWARDED]}/{admitted[FORWARDED]} ({p99[FORWARDED]}, "
            f"{pre[FORWARDED]}); KV budget {late[BUDGET]}/{admitted[BUDGET]} ({p99[BUDGET]}, "
            f"{pre[BUDGET]}), inside §6's region in {inside} of {len(budget_runs)} runs"
        )
    deadline = rows[0]["deadline_ms"] if rows else region_deadline_ms()
    return (
        f"d = {deadline:.0f} ms, docs/design.md §6's bound for what the budget runs at once. "
        + "; ".join(parts)
        + ". Inside the region the budget's floor has its bound by construction: an "
        "entitled request waits at most for one running request to end (none is preempted) "
        "and then runs. Slot dispatch has no such bound once the cache overflows: a floor "
        "request started in a full cache waits in the backend's own queue or is preempted "
        "and recomputed, and only the backend's speed decides whether that still fits d."
    )


E22 = Experiment(
    "E22",
    "Memory pressure inside the floor's region",
    "E21's workload (one backend of C = 4, v100-moe, a KV cache of 32 or 40 blocks of 16 "
    "tokens that preempts as vLLM's does; 100-token prompts, ℓ = 64; an opportunistic "
    "Poisson 10/s) with the assured tenant at B = 1 per 1.5 s window and d at docs/design.md §6's "
    "bound under the budget, s_max(64, 100)·(1 + ⌈B/C⌉) with C what the cache runs at once "
    "(2 of 32 blocks, 3 of 40), so the budget's rows are inside the region and its "
    "guarantee applies; 15 s; the same four dispatches; reps 5. Not a published experiment: "
    "design §16's claim that the floor's bound holds under long prompts with the budget. Its "
    "512-token conditions on real vLLM: `floorguard experiment run E22 --backend` "
    "(docs/vllm.md).",
    _e22,
    reps=5,
    shown=("floor", "kv_blocks", "policy", "kv_budget", "forward_priority"),
    extra=_extra,
    reading=_reading,
)
