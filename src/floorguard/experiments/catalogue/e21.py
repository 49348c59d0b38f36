"""E21: memory pressure (design §16) — slots that vLLM can preempt when its KV cache runs out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import mean_of
from floorguard.sim.scenarios import KV_OUTPUT_TOKENS

FLOORS = (1, 2, 3)
"""The assured tenant's floor B per 1 s window, paced at B/s: its own sequences in flight
(B × ≈ 1.1–1.9 s) from under the budget's concurrency to past C = 4 (a floor past
its region shows nothing about the budget)."""
CACHES = (32, 40)
"""The backend's KV cache in 16-token blocks: four running requests need 44 by their end,
so both overflow; 32 holds two at once under the budget, 40 three."""
DISPATCH = (
    ("server-priority", False, False),  # vLLM's own priority scheduler, no guard
    ("guard", False, False),  # the guard by slots only, no priority forwarded (FCFS cache)
    ("guard", False, True),  # by slots, each class's priority forwarded to vLLM's policy
    ("guard", True, False),  # the guard budgeting the KV cache
)
"""(policy, kv_budget, forward_priority) of each dispatch compared."""
SERVER, SLOTS, FORWARDED, BUDGET = DISPATCH


def memory_condition(
    floor: int,
    blocks: int,
    dispatch: tuple[str, bool, bool],
    *,
    window_s: float,
    deadline_ms: float,
    duration_s: float,
) -> Condition:
    """One memory-pressure condition (E21, E22): the assured tenant paced at B per window,
    the opportunistic Poisson 10/s, ℓ = 64 (the scenario's 100-token prompts)."""
    policy, budget, forward = dispatch
    return Condition(
        policy=policy,
        workload="kv-pressure",
        kv_blocks=blocks,
        kv_budget=budget,
        forward_priority=forward,
        floor=floor,
        assured_rate=floor / window_s,
        opp_rate=10.0,
        window_s=window_s,
        deadline_ms=deadline_ms,
        tokens=KV_OUTPUT_TOKENS,
        duration_s=duration_s,
    )


def _e21(quick: bool) -> list[Condition]:
    return [
        memory_condition(
            floor, blocks, d, window_s=1.0, deadline_ms=2500.0, duration_s=6.0 if quick else 10.0
        )
        for floor in FLOORS
        for blocks in CACHES
        for d in DISPATCH
    ]


def _label(row: RunRow) -> str:
    if row["policy"] != "guard":
        return row["policy"]
    if row["kv_budget"]:
        return "guard, KV budget"
    return "guard, slots, priority forwarded" if row["forward_priority"] else "guard, slots only"


Cell = tuple[int, int]
"""(B, KV blocks)."""
Dispatch = tuple[str, bool, bool]


def _cell(rows: Sequence[RunRow], cell: Cell, dispatch: Dispatch) -> list[RunRow]:
    return [
        r
        for r in rows
        if ((r["floor"], r["kv_blocks"]), (r["policy"], r["kv_budget"], r["forward_priority"]))
        == (cell, dispatch)
    ]


def _p99_ms(runs: Sequence[RunRow]) -> float | None:
    """The assured sojourn p99, mean over the reps that completed any (ms)."""
    mean = mean_of(runs, "a_sojourn_p99_s")
    return None if mean is None else 1e3 * mean


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _sum(rows: Sequence[RunRow], key: str, cell: Cell, d: Dispatch) -> int:
    return sum(int(cast(dict[str, Any], r)[key]) for r in _cell(rows, cell, d))


def _extra(rows: Sequence[RunRow]) -> str:
    lines = [
        "| B | KV cache | dispatch | preemptions (A's) | A late / admitted | A sojourn p99 ms | "
        "A unmet | goodput (req/s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for floor, blocks in sorted({(r["floor"], r["kv_blocks"]) for r in rows}):
        for policy, budget, forward in DISPATCH:
            runs = _cell(rows, (floor, blocks), (policy, budget, forward))
            if not runs:
                continue
            late = sum(r["a_late"] for r in runs)
            admitted = sum(r["a_admitted"] for r in runs)
            unmet = [r["a_unmet"] for r in runs if r["a_unmet"] is not None]
            goodput = sum(r["goodput_per_s"] for r in runs) / len(runs)
            tokens = blocks * runs[0]["kv_block_tokens"]
            lines.append(
                f"| {floor} | {blocks} blocks ({tokens} tokens) | {_label(runs[0])} | "
                f"{sum(r['preemptions'] for r in runs)} "
                f"({sum(r['a_preempted'] for r in runs)}) | {late}/{admitted} | "
                f"{_ms(_p99_ms(runs))} | {sum(unmet) / len(unmet):.2f} | {goodput:.2f} |"
            )
    return "\n".join(lines)


def _fits(rows: Sequence[RunRow]) -> str:
    """What the budget did to the floor's p99 and lateness, by floor, against slot dispatch."""
    said = []
    for floor in FLOORS:
        cells = [(floor, b) for b in CACHES if _cell(rows, (floor, b), SLOTS)]
        ratios = [
            f"{k / s:.2f}"
            for c in cells
            if (s := _p99_ms(_cell(rows, c, SLOTS))) is not None
            and (k := _p99_ms(_cell(rows, c, BUDGET))) is not None
        ]
        if not ratios:
            continue
        late_slots = sum(_sum(rows, "a_late", c, SLOTS) for c in cells)
        late_budget = sum(_sum(rows, "a_late", c, BUDGET) for c in cells)
        said.append(
            f"at B = {floor}, {' and '.join(ratios)} × slot dispatch's assured p99 (by cache) "
            f"and {late_budget} late against {late_slots}"
        )
    return (
        "The budget gave, "
        + "; ".join(said)
        + ". Under the budget an assured request waits for room (the running ones to end) "
        "and then runs in a smaller batch, where slot dispatch starts it at once and may "
        "preempt it; the wait is bounded only while the floor's own load fits the "
        "concurrency the budget leaves, which 3/s of ≈ 1.1–1.9 s services does not (more "
        "than the budget's 2 or 3 of its own at once: outside docs/design.md §6's region, where "
        "nothing bounds the floor's wait under any dispatch)."
    )


def _reading(rows: Sequence[RunRow]) -> str:
    parts = []
    for floor in FLOORS:
        for blocks in CACHES:
            cell = (floor, blocks)
            if not _cell(rows, cell, SLOTS):
                continue
            pre = {d: _sum(rows, "preemptions", cell, d) for d in DISPATCH}
            mine = {d: _sum(rows, "a_preempted", cell, d) for d in DISPATCH}
            late = {d: _sum(rows, "a_late", cell, d) for d in DISPATCH}
            p99 = {d: _p99_ms(_cell(rows, cell, d)) for d in DISPATCH}
            parts.append(
                f"B = {floor}, {blocks} blocks (the budget runs {blocks * 16 // 176} at once): "
                f"preemptions (the floor's), assured late, assured p99 — server priority "
                f"{pre[SERVER]} ({mine[SERVER]}), {late[SERVER]}, {_ms(p99[SERVER])} ms; by "
                f"slots {pre[SLOTS]} ({mine[SLOTS]}), {late[SLOTS]}, {_ms(p99[SLOTS])} ms; by "
                f"slots, priority forwarded {pre[FORWARDED]} ({mine[FORWARDED]}), "
                f"{late[FORWARDED]}, {_ms(p99[FORWARDED])} ms; KV budget {pre[BUDGET]} "
                f"({mine[BUDGET]}), {late[BUDGET]}, {_ms(p99[BUDGET])} ms"
            )
    floor_slots = sum(_sum(rows, "a_preempted", (f, b), SLOTS) for f in FLOORS for b in CACHES)
    moved = floor_slots - sum(
        _sum(rows, "a_preempted", (f, b), FORWARDED) for f in FLOORS for b in CACHES
    )
    return (
        "; ".join(parts)
        + ". The budget removes the preemptions by construction: a backend starts only what "
        "its cache holds to the end. What it does to the floor depends on whether the "
        "floor's own load fits the concurrency the budget leaves: it reserves each request's "
        "whole prompt + output cap (100 + 64 → 176 tokens) from its start, so the cache runs "
        "⌊tokens / 176⌋ at once, where vLLM allocates as sequences grow and runs all four "
        "until the cache fills, then preempts one, which costs its victim a second prefill "
        "of 100 + what it streamed. " + _fits(rows) + " Which sequence vLLM preempts "
        "decides whose request pays: without a priority (FCFS, or every request at vLLM's "
        "default 0) it is the last admitted, the floor's as often as not; with each class's "
        "priority (server priority, or the guard with `forward_priority` over vLLM's "
        "priority policy) it is the surplus's while any surplus sequence runs. Forwarding the "
        f"priority took {moved} of the floor's {floor_slots} preemptions under slot dispatch "
        "off it; the rest came while only assured sequences ran, where no victim order can "
        "spare the floor."
    )


E21 = Experiment(
    "E21",
    "Memory pressure: a KV cache that preempts",
    "One backend of C = 4 (v100-moe) whose KV cache holds 32 or 40 blocks of 16 tokens, "
    "modelled as vLLM's: a running sequence holds ⌈(prompt + out + 1)/16⌉ blocks and one is "
    "preempted (recomputed) when the next block cannot be had — the last admitted (FCFS) or, "
    "where requests carry their class's priority, vLLM's priority policy's victim: the "
    "running one of the largest (priority, arrival). 100-token prompts, ℓ = 64; the assured "
    "tenant paced at B = 1, 2 or 3 per 1 s window, an opportunistic Poisson 10/s, d = 2.5 s "
    "for both, 10 s; vLLM's priority scheduler alone, the guard dispatching by slots "
    "(forwarding no priority, or each class's), and the guard budgeting the cache "
    "(docs/design.md §16); reps 5. Not a published experiment: docs/design.md §16's "
    "requirement, on the "
    "simulator; its 512-token conditions on real vLLM are in the section 'On a real "
    "backend: memory pressure (E21)' (`floorguard experiment run E21 --backend`, "
    "docs/vllm.md).",
    _e21,
    reps=5,
    shown=("floor", "kv_blocks", "policy", "kv_budget", "forward_priority"),
    extra=_extra,
    reading=_reading,
)
