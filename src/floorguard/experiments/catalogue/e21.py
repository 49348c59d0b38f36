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
    ("server-priority", False),  # vLLM's own priority scheduler, no guard
    ("guard", False),  # the guard by slots only
    ("guard", True),  # the guard budgeting the KV cache
)


def _e21(quick: bool) -> list[Condition]:
    return [
        Condition(
            policy=policy,
            workload="kv-pressure",
            kv_blocks=blocks,
            kv_budget=budget,
            duration_s=6.0 if quick else 10.0,
        )
        for blocks in CACHES
        for policy, budget in DISPATCH
    ]


def _label(row: RunRow) -> str:
    if row["policy"] != "guard":
        return row["policy"]
    return "guard, KV budget" if row["kv_budget"] else "guard, slots only"


def _cell(rows: Sequence[RunRow], blocks: int, policy: str, budget: bool) -> list[RunRow]:
    return [
        r for r in rows if (r["kv_blocks"], r["policy"], r["kv_budget"]) == (blocks, policy, budget)
    ]


def _extra(rows: Sequence[RunRow]) -> str:
    lines = [
        "| KV cache | dispatch | preemptions (A's) | A late / admitted | A unmet | "
        "goodput (req/s) |",
        "|---|---|---|---|---|---|",
    ]
    for blocks in CACHES:
        for policy, budget in DISPATCH:
            runs = _cell(rows, blocks, policy, budget)
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


def _sum(rows: Sequence[RunRow], key: str, blocks: int, policy: str, budget: bool) -> int:
    return sum(int(cast(dict[str, Any], r)[key]) for r in _cell(rows, blocks, policy, budget))


def _reading(rows: Sequence[RunRow]) -> str:
    parts = []
    for blocks in CACHES:
        pre = {d: _sum(rows, "preemptions", blocks, *d) for d in DISPATCH}
        mine = _sum(rows, "a_preempted", blocks, *DISPATCH[1])
        late = {d: _sum(rows, "a_late", blocks, *d) for d in DISPATCH}
        at_once = blocks * 16 // 176
        parts.append(
            f"With {blocks} blocks: {pre[DISPATCH[0]]} vLLM-style preemptions under server "
            f"priority, {pre[DISPATCH[1]]} under the guard by slots ({mine} of them the "
            f"floor's tenant's), {pre[DISPATCH[2]]} under its KV budget; assured late "
            f"{late[DISPATCH[0]]}, {late[DISPATCH[1]]} and {late[DISPATCH[2]]} (the budget "
            f"runs {at_once} at once)"
        )
    return (
        ". ".join(parts)
        + ". The budget removes the preemptions by construction: a backend starts only what "
        "its cache holds to the end. It does not put the floor on time, and here it costs "
        "the floor: it reserves each request's whole prompt + output cap (100 + 64 → 176 "
        "tokens) from its start, so the cache runs ⌊tokens / 176⌋ at once, where vLLM "
        "allocates as sequences grow and runs all four until the cache fills, then preempts "
        "one — which costs its victim a second prefill of 100 + what it streamed (floor "
        "requests among them), less than the concurrency the budget gives up. This "
        "workload (B = 3 per 1 s window of 1.8 s services) is outside SPEC §6's region even "
        "at C = 4, and its report names the smaller C under the budget."
    )


E21 = Experiment(
    "E21",
    "Memory pressure: a KV cache that preempts",
    "One backend of C = 4 (v100-moe) whose KV cache holds 32 or 40 blocks of 16 tokens, "
    "modelled as vLLM's: a running sequence holds ⌈(prompt + out + 1)/16⌉ blocks and the "
    "last admitted is preempted (recomputed) when the next block cannot be had. 100-token "
    "prompts, ℓ = 64; the assured tenant paced at B = 3 per 1 s window, an opportunistic "
    "Poisson 10/s, d = 2.5 s for both, 10 s; vLLM's priority scheduler alone, the guard "
    "dispatching by slots, and the guard budgeting the cache (SPEC §16); reps 5. Not a "
    "published experiment: SPEC §16's new requirement, on the simulator (real vLLM rows: "
    "not yet run).",
    _e21,
    reps=5,
    shown=("kv_blocks", "policy", "kv_budget"),
    extra=_extra,
    reading=_reading,
)
