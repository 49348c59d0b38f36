"""E23: the floor's first tokens under a flood of long decodes (docs/design.md §19) — the
guard keeping `r` slots for the floor, the guard without, vLLM's priority scheduler and
admit-all, with what each costs the surplus and where §19's bound holds."""

from __future__ import annotations

from collections.abc import Sequence

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.profiles import get_profile

FLOORS = (2, 4)
TTFT_MS = (1000.0, 2000.0)
RESERVED = (0, 1, 2, 3)
FLOOD_TOKENS, FLOOD_RATE = 256, 2.0
"""The flood: Poisson 2/s of 256-token decodes, each ≈ 4 s at a full batch (v100-moe's
183 + 14.9·ℓ ms), twice what C = 4 slots serve: every slot is always held by one."""
TPOT_MS = 50.0
CEILING_256_S = get_profile("v100-moe").ceiling.at(FLOOD_TOKENS)
OTHERS = ("server-priority", "unguarded")
"""vLLM's priority scheduler (admit-all into the server's queue, the floor first) and
admit-all FIFO (the always-admit learner, no floor order)."""


def _e23(quick: bool) -> list[Condition]:
    def cell(policy: str, floor: int, ttft_ms: float, reserved: int = 0) -> Condition:
        return Condition(
            policy=policy,
            workload="chat-flood",
            floor=floor,
            assured_rate=float(floor),  # paced: B a window of W = 1 s
            opp_rate=FLOOD_RATE,
            flood_tokens=FLOOD_TOKENS,
            ttft_ms=ttft_ms,
            tpot_ms=TPOT_MS,
            deadline_ms=60_000.0,  # the flood's: a long decode is not dropped for its length
            reserved_slots=reserved,
            duration_s=6.0 if quick else 12.0,
        )

    if quick:  # the real backend's grid too: B = 2 at the tight TTFT, r ∈ {0, 2}
        return [
            *(cell("guard", FLOORS[0], TTFT_MS[0], r) for r in (0, 2)),
            *(cell(p, FLOORS[0], TTFT_MS[0]) for p in OTHERS),
        ]
    return [
        c
        for floor in FLOORS
        for ttft_ms in TTFT_MS
        for c in (
            *(cell("guard", floor, ttft_ms, r) for r in RESERVED),
            *(cell(p, floor, ttft_ms) for p in OTHERS),
        )
    ]


def _label(run: RunRow) -> str:
    if run["policy"] == "guard":
        return f"guard, r = {run['reserved_slots']}"
    return {"server-priority": "vLLM priority", "unguarded": "admit-all"}[run["policy"]]


def _cells(rows: Sequence[RunRow]) -> list[tuple[int, float, str, list[RunRow]]]:
    out: dict[tuple[int, float, str], list[RunRow]] = {}
    for r in rows:
        out.setdefault((r["floor"], r["ttft_ms"], _label(r)), []).append(r)
    order = {f"guard, r = {r}": i for i, r in enumerate(RESERVED)}
    order |= {"vLLM priority": len(RESERVED), "admit-all": len(RESERVED) + 1}
    return [
        (floor, ttft, label, runs)
        for (floor, ttft, label), runs in sorted(
            out.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])
        )
    ]


def _met(runs: Sequence[RunRow]) -> tuple[int, int]:
    return sum(r["ttft_met"] for r in runs), sum(r["ttft_entitled"] for r in runs)


def _worst_ms(values: Sequence[float | None]) -> float | None:
    """The largest, in ms (None: none measured)."""
    present = [v for v in values if v is not None]
    return max(present) * 1e3 if present else None


def _surplus(runs: Sequence[RunRow]) -> float:
    return sum(r["o_tokens_per_s"] for r in runs) / len(runs)


def _region(runs: Sequence[RunRow]) -> str:
    if runs[0]["policy"] != "guard":
        return "–"
    inside = sum(bool(r["ft_inside"]) for r in runs)
    bound = runs[0]["ft_bound_s"]
    at = f", bound {bound * 1e3:.0f} ms" if bound is not None else ""
    return f"inside {inside}/{len(runs)}{at}"


def _extra(rows: Sequence[RunRow]) -> str:
    lines = [
        "| B | TTFT (ms) | stack | floor's first tokens on time | assured TTFT p99 / max (ms, "
        "worst run) | assured TPOT p99 (ms, worst run) | surplus tokens/s (× guard r = 0) | "
        "§19 region |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for floor, ttft, label, runs in _cells(rows):
        met, entitled = _met(runs)
        base = [r for f, t, lab, rs in _cells(rows) if (f, t, lab) == (floor, ttft, "guard, r = 0")
                for r in rs]  # fmt: skip
        ratio = _surplus(runs) / _surplus(base) if base and _surplus(base) else float("nan")
        p99 = _worst_ms([r["a_ttft_p99_s"] for r in runs])
        worst = _worst_ms([r["a_ttft_max_s"] for r in runs])
        tpot = _worst_ms([r["a_tpot_p99_s"] for r in runs])
        per_token = "–" if tpot is None else f"{tpot:.1f}"
        lines.append(
            f"| {floor} | {ttft:.0f} | {label} | {met}/{entitled} ({met / entitled:.1%}) | "
            f"{p99:.0f} / {worst:.0f} | {per_token} | {_surplus(runs):.0f} ({ratio:.2f}) | "
            f"{_region(runs)} |"
            if entitled and p99 is not None and worst is not None
            else f"| {floor} | {ttft:.0f} | {label} | – | – | {per_token} | "
            f"{_surplus(runs):.0f} | {_region(runs)} |"
        )
    return "\n".join(lines)


def _reading(rows: Sequence[RunRow]) -> str:
    cells = _cells(rows)
    inside = [(f, t, lab, runs) for f, t, lab, runs in cells if all(r["ft_inside"] for r in runs)]
    inside_met = [_met(runs) for *_, runs in inside]
    met, entitled = sum(m for m, _ in inside_met), sum(n for _, n in inside_met)
    parts = []
    for floor in sorted({c[0] for c in cells}):
        for ttft in sorted({c[1] for c in cells if c[0] == floor}):
            here = {lab: runs for f, t, lab, runs in cells if (f, t) == (floor, ttft)}
            inside_r = [lab for lab, runs in here.items() if all(r["ft_inside"] for r in runs)]
            shares = ", ".join(
                f"{lab} {_met(runs)[0] / max(_met(runs)[1], 1):.0%}" for lab, runs in here.items()
            )
            parts.append(
                f"B = {floor}, TTFT {ttft:.0f} ms: on time {shares}; inside the region: "
                + (", ".join(inside_r) if inside_r else "no r")
            )
    base = {(f, t): _surplus(runs) for f, t, lab, runs in cells if lab == "guard, r = 0"}
    costs = [
        f"r = {runs[0]['reserved_slots']} at B = {f}: {_surplus(runs) / base[(f, t)]:.2f}×"
        for f, t, lab, runs in cells
        if lab.startswith("guard") and runs[0]["reserved_slots"] and (f, t) in base
        and t == TTFT_MS[0]
    ]  # fmt: skip
    held = (
        f"Inside §19's region the floor's first tokens were on time in {met} of {entitled}"
        + (" — every one, as the bound says." if met == entitled else " — **not every one**.")
        if entitled
        else "No cell was inside §19's region."
    )
    beyond = [
        f"{lab} at B = {f}, TTFT {t:.0f} ms"
        for f, t, lab, runs in cells
        if runs[0]["policy"] == "guard"
        and runs[0]["reserved_slots"]
        and not all(r["ft_inside"] for r in runs)
        and _met(runs)[0] == _met(runs)[1]
    ]
    outside = (
        " Outside it the floor was still on time in every run of "
        + "; ".join(beyond)
        + ": the bound is sufficient, not necessary."
        if beyond
        else ""
    )
    by_cell = {(f, t, lab): _met(runs) for f, t, lab, runs in cells}
    same = [
        (f, t)
        for f, t, lab, _ in cells
        if lab == "guard, r = 0" and by_cell.get((f, t, "vLLM priority")) == by_cell[(f, t, lab)]
    ]
    alike = (
        f" Without reserved slots the guard met exactly what vLLM's priority scheduler met in "
        f"{len(same)} of {len(base)} cells: both start a floor request when a slot frees, and "
        "with the slots held by 4-second decodes that is the shortest residual of those "
        "running, whatever the priority; where the floor's own requests keep slots busy "
        "(B = 4) fewer are left to the flood."
    )
    lent = (
        " No reserved slot could be lent to the flood: a 256-token decode's ceiling, "
        f"{CEILING_256_S:.1f} s, is longer than the window."
    )
    return (
        "Floor-entitled first tokens on time (arrival + TTFT), by stack — "
        + "; ".join(parts)
        + f". {held}{outside}{alike} The reservation's cost is the surplus's output while "
        "the flood was offered, against the guard without one (TTFT "
        f"{TTFT_MS[0]:.0f} ms): " + "; ".join(costs) + "." + lent
    )


E23 = Experiment(
    "E23",
    "First tokens under a flood of long decodes",
    "One backend of C = 4 (v100-moe), W = 1 s. An assured chat tenant paced at B = 2 or 4 a "
    "window, ℓ = 16, its contract in first-token terms (TTFT 1000 or 2000 ms, TPOT 50 ms: due "
    "at TTFT + 50 ms·ℓ); an opportunistic flood of 256-token decodes, Poisson 2/s (twice "
    f"what the slots serve at that length). The guard with r ∈ {set(RESERVED)} reserved slots "
    "(docs/design.md §19; always-admit learner), vLLM's priority scheduler (admit-all into "
    "the server's queue, the floor at priority 0, non-preemptive) and admit-all FIFO; doom "
    "gate off; 12 s; reps 5. Floor attainment is over the contract's first B requests of "
    "each window, whatever the stack. Not a published experiment: design §19's claim, on "
    "the simulator (first token at the end of the request's prefill in the batch it joins).",
    _e23,
    reps=5,
    shown=("floor", "ttft_ms", "policy", "reserved_slots"),
    extra=_extra,
    reading=_reading,
)
