"""E21: memory pressure (SPEC §16) — slots that vLLM can preempt when its KV cache runs out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment

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


def _e21(quick: bool) -> list[Condition]:
    return [
        Condition(
            policy=policy,
            workload="kv-pressure",
            kv_blocks=blocks,
            kv_budget=budget,
            forward_priority=forward,
            duration_s=6.0 if quick else 10.0,
        )
        for blocks in CACHES
        for policy, budget, forward in DISPATCH
    ]


def _label(row: RunRow) -> str:
    if row["policy"] != "guard":
        return row["policy"]
    if row["kv_budget"]:
        return "guard, KV budget"
    return "guard, slots, priority forwarded" if row["forward_priority"] else "guard, slots only"


def _cell(
    rows: Sequence[RunRow], blocks: int, policy: str, budget: bool, forward: bool
) -> list[RunRow]:
    return [
        r
        for r in rows
        if (r["kv_blocks"], r["policy"], r["kv_budget"], r["forward_priority"])
        == (blocks, policy, budget, forward)
    ]


def _extra(rows: Sequence[RunRow]) -> str:
    lines = [
        "| KV cache | dispatch | preemptions (A's) | A late / admitted | A unmet | "
        "goodput (req/s) |",
        "|---|---|---|---|---|---|",
    ]
    for blocks in CACHES:
        for policy, budget, forward in DISPATCH:
            runs = _cell(rows, blocks, policy, budget, forward)
            if not runs:
                continue
            late = sum(r["a_late"] for r in runs)
            admitted = sum(r["a_admitted"] for r in runs)
            unmet = [r["a_unmet"] for r in runs if r["a_unmet"] is not None]
            goodput = sum(r["goodput_per_s"] for r in runs) / len(runs)
            lines.append(
                f"| {blocks} blocks ({blocks * 16} tokens) | {_label(runs[0])} | "
                f"{sum(r['preemptions'] for r in runs)} "
                f"({sum(r['a_preempted'] for r in runs)}) | {late}/{admitted} | "
                f"{sum(unmet) / len(unmet):.2f} | {goodput:.2f} |"
            )
    return "\n".join(lines)


def _sum(rows: Sequence[RunRow], key: str, blocks: int, d: tuple[str, bool, bool]) -> int:
    return sum(int(cast(dict[str, Any], r)[key]) for r in _cell(rows, blocks, *d))


def _reading(rows: Sequence[RunRow]) -> str:
    parts = []
    for blocks in CACHES:
        pre = {d: _sum(rows, "preemptions", blocks, d) for d in DISPATCH}
        mine = {d: _sum(rows, "a_preempted", blocks, d) for d in DISPATCH}
        late = {d: _sum(rows, "a_late", blocks, d) for d in DISPATCH}
        at_once = blocks * 16 // 176
        parts.append(
            f"With {blocks} blocks, vLLM-style preemptions (the floor tenant's among them) and "
            f"assured late: server priority {pre[SERVER]} ({mine[SERVER]}), {late[SERVER]} "
            f"late; the guard by slots {pre[SLOTS]} ({mine[SLOTS]}), {late[SLOTS]} late; by "
            f"slots with the priority forwarded {pre[FORWARDED]} ({mine[FORWARDED]}), "
            f"{late[FORWARDED]} late; under its KV budget {pre[BUDGET]} ({mine[BUDGET]}), "
            f"{late[BUDGET]} late (the budget runs {at_once} at once)"
        )
    floor_slots = sum(_sum(rows, "a_preempted", b, SLOTS) for b in CACHES)
    moved = floor_slots - sum(_sum(rows, "a_preempted", b, FORWARDED) for b in CACHES)
    return (
        ". ".join(parts)
        + ". The budget removes the preemptions by construction: a backend starts only what "
        "its cache holds to the end. It does not put the floor on time, and here it costs "
        "the floor: it reserves each request's whole prompt + output cap (100 + 64 → 176 "
        "tokens) from its start, so the cache runs ⌊tokens / 176⌋ at once, where vLLM "
        "allocates as sequences grow and runs all four until the cache fills, then preempts "
        "one — which costs its victim a second prefill of 100 + what it streamed, less than "
        "the concurrency the budget gives up. Which sequence vLLM preempts decides whose "
        "request pays: without a priority (FCFS, or every request at vLLM's default 0) it is "
        "the last admitted, the floor's as often as not; with each class's priority (server "
        "priority, or the guard with `forward_priority` over vLLM's priority policy) it is "
        f"the surplus's while any surplus sequence runs. Forwarding the priority took "
        f"{moved} of the floor's {floor_slots} preemptions under slot dispatch off it; the "
        "rest came while only assured sequences ran (the tenant offers 3/s of ≈ 1.8 s "
        "services, more than C = 4 of its own at once), where no victim order can spare "
        "the floor. This workload (B = 3 per 1 s window "
        "of 1.8 s services) is outside SPEC §6's region even at C = 4, and its report names "
        "the smaller C under the budget."
    )


E21 = Experiment(
    "E21",
    "Memory pressure: a KV cache that preempts",
    "One backend of C = 4 (v100-moe) whose KV cache holds 32 or 40 blocks of 16 tokens, "
    "modelled as vLLM's: a running sequence holds ⌈(prompt + out + 1)/16⌉ blocks and one is "
    "preempted (recomputed) when the next block cannot be had — the last admitted (FCFS) or, "
    "where requests carry their class's priority, vLLM's priority policy's victim: the "
    "running one of the largest (priority, arrival). 100-token prompts, ℓ = 64; the assured "
    "tenant paced at B = 3 per 1 s window, an opportunistic Poisson 10/s, d = 2.5 s for both, "
    "10 s; vLLM's priority scheduler alone, the guard dispatching by slots (forwarding no "
    "priority, or each class's), and the guard budgeting the cache (SPEC §16); reps 5. Not a "
    "published experiment: SPEC §16's new requirement, on the simulator (real vLLM rows: "
    "not yet run).",
    _e21,
    reps=5,
    shown=("kv_blocks", "policy", "kv_budget", "forward_priority"),
    extra=_extra,
    reading=_reading,
)
