"""E7 (the operating-region map), E8 (server priority with vLLM semantics vs the guard)
and E9 (static rate limits: per-class vs a flat cap)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from floorguard.experiments import figures
from floorguard.experiments.catalogue._common import _by_policy, _pooled_share, _range
from floorguard.experiments.conditions import Condition, mu_sat_of
from floorguard.experiments.records import RunRow
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize


def _same(a: float | None, b: float | None) -> bool:
    """Two measured p99s equal to the nanosecond (neither missing)."""
    return a is not None and b is not None and abs(a - b) < 1e-9


def _e7(quick: bool) -> list[Condition]:
    floors = (2, 6, 12) if quick else (2, 4, 6, 8, 10, 12)
    deadlines = (400, 1000, 2600) if quick else (400, 600, 800, 1000, 1300, 1600, 2000, 2600)
    return [
        Condition(floor=b, assured_rate=float(b), opp_rate=2.0, deadline_ms=d)
        for b in floors
        for d in deadlines
    ]


def _reading_e7(rows: Sequence[RunRow]) -> str:
    summaries = summarize(rows)
    inside = [s for s in summaries if s["inside_region"]]
    outside = [s for s in summaries if not s["inside_region"]]
    held_out = [s for s in outside if s["a_late"] == 0]
    return (
        f"{len(inside)} of {len(summaries)} cells lie inside docs/design.md §6's region; their "
        f"assured miss is {_range(inside)}. Outside it, {len(held_out)} of {len(outside)} "
        f"cells still had no late assured request (miss {_range(outside)} overall)"
        + (
            ": the bound is sufficient, not necessary, and the measured boundary lies beyond it."
            if held_out
            else ": here the measured boundary is the bound itself."
        )
    )


E7 = Experiment(
    "E7",
    "Operating-region map",
    "Heatmap of guard assured miss over B ∈ {2, …, 12} (assured paced at B/s, so ρ_eff grows "
    "with B) × d ∈ {400, …, 2600} ms, opportunistic Poisson 2/s (light, chosen so ρ_eff spans "
    "both sides of 1), v100-moe; reps 5. The §6 region: "
    "ρ_a = B·s_max/(C·W) ≤ 1, d ≥ s_max·(1 + ⌈B/C⌉), every service ≤ s_max, max Q_A ≤ B.",
    _e7,
    reps=5,
    shown=("floor", "deadline_ms"),
    figures=(figures.region_heatmap,),
    reading=_reading_e7,
)

# -- E8–E11: the other stacks, meters, capacity loss --------------------------------------


def _e8_reading(rows: Sequence[RunRow]) -> str:
    server = [s for s in summarize(rows) if s["policy"] == "server-priority"]
    late = sum(s["a_late"] for s in server)
    text = _by_policy(rows, "As d tightens,")
    if late == 0:
        by = {p: [r for r in rows if r["policy"] == p] for p in ("guard", "server-priority")}
        facts = "; ".join(
            f"{p}: O admitted {_pooled_share(runs, 'o')}, ρ_eff "
            f"{np.mean([r['rho_eff'] for r in runs]):.2f}, assured wait p99 "
            f"{max(r['a_queue_wait_p99_s'] or 0.0 for r in runs) * 1e3:.0f} ms, longest service "
            f"{max(r['max_service_s'] for r in runs) * 1e3:.0f} ms"
            for p, runs in by.items()
            if runs
        )
        pairs = {
            (r["deadline_ms"], r["seed"]): r["a_sojourn_p99_s"]
            for r in rows
            if r["policy"] == "guard"
        }
        twins = [
            _same(pairs[r["deadline_ms"], r["seed"]], r["a_sojourn_p99_s"])
            for r in rows
            if r["policy"] == "server-priority" and (r["deadline_ms"], r["seed"]) in pairs
        ]
        return text + (
            f" The stacks do not separate on this model ({facts}). In {sum(twins)} of "
            f"{len(twins)} same-seed pairs the assured p99 sojourn is the same to the "
            "nanosecond: both stacks keep every slot busy, so with every request 16 tokens "
            "long the slots turn over at the same instants in both, and the assured go first "
            "in both queues; which opportunistic request fills a slot changes nothing an "
            "assured request sees. A priority-jumped request waits for one running slot "
            "(non-preemptive on both) and then its own service, within even 900 ms; the "
            "learner's shedding only shortens a queue the assured requests jump anyway. "
            "docs/design.md §11 attributes "
            "server priority's published slip to the backlog admit-all holds *inside* the "
            "server. Measured on the vLLM CPU backend (`floorguard bench backlog`, "
            "docs/calibration.md), hundreds of requests *held* in vLLM's queue leave running "
            "requests' step time within the rep-to-rep spread, so the model charges none. "
            "Where the real paired runs separate them (the real section below gives each "
            "paired difference with its interval), what this model lacks is the cost of the "
            "flood's *arrival* at the server: every request parsed, tokenized and queued by "
            "vLLM's API server, which on that backend slows decode 1.2–1.7× while they arrive "
            "(≈ 2.2 ms of the one core the engine shares per request). It is left out on "
            "purpose: on the published GPU node the API server parses on host cores beside a "
            "GPU engine, so the CPU backend's figure is not a GPU decode cost, and no "
            "published figure measures one; a profile calibrated on a CPU backend would need "
            "it to predict server priority there (the real section's sim column misses "
            "server priority's slip by as much)."
        )
    return text + (
        " Server priority reorders the waiting queue but never evicts a running sequence, so "
        "a priority-jumped assured request still waits for a running slot; admitting all, it "
        "also has no floor to refuse at."
    )


E8 = Experiment(
    "E8",
    "Server priority (vLLM semantics) vs guard",
    "Server priority: admit-all straight into the server's own waiting queue, ordered by "
    "per-request priority (assured 0, opportunistic 1), over C = 4 non-preemptive slots (the "
    "queue is reordered, a running sequence is never evicted; the flood keeps every slot "
    "busy). The guard: the marquee guard (the `published` predictor, sheddable-only, β = 1). "
    "Marquee load, d ∈ {1284, 1100, 1000, 900} ms, doom gate off in both; reps 3.",
    lambda quick: [
        Condition(
            policy=p,
            learner="predictor-sheddable" if p == "guard" else "always-admit",
            deadline_ms=d,
        )
        for d in (1284, 1100, 1000, 900)
        for p in ("guard", "server-priority")
    ],
    reps=3,
    shown=("policy", "deadline_ms"),
    reading=_e8_reading,
)

E9 = Experiment(
    "E9",
    "Static rate limits: per-class vs flat cap",
    "Marquee load. As docs/design.md §11 states E9, each class's static cap is its share of the "
    "*measured* capacity μ_sat (v100-moe, C = 4, `sim.targets.saturated_capacity`): "
    "rate-limit-class has the assured bucket at B/W = 6/s and the opportunistic one at what "
    "is left, μ_sat − 6/s, so the two together are μ_sat; rate-limit-flat is one bucket at "
    "μ_sat. Buckets hold 1 s of their rate, in front of the backend's FIFO. The guard "
    "(always-admit) for reference; reps 8.",
    lambda quick: [
        Condition(policy=p, static_caps_at_capacity=True)
        for p in ("guard", "rate-limit-class", "rate-limit-flat")
    ],
    reps=8,
    reading=lambda rows: _by_policy(rows, "Under the flood,") + _e9_caps(rows),
)


def _e9_caps(rows: Sequence[RunRow]) -> str:
    mu_sat = mu_sat_of("v100-moe", 4)
    flat = summarize([r for r in rows if r["policy"] == "rate-limit-flat"])
    per_class = summarize([r for r in rows if r["policy"] == "rate-limit-class"])
    if not flat or not per_class:
        return ""
    flat_unmet, class_unmet = flat[0]["unmet"] or 0.0, per_class[0]["unmet"] or 0.0
    return (
        f" Measured μ_sat {mu_sat:.2f}/s: per-class caps 6/s + {max(mu_sat - 6, 0):.2f}/s, "
        f"flat cap {mu_sat:.2f}/s. Assured unmet: flat {flat_unmet:.3f}, per-class "
        f"{class_unmet:.3f}. "
        + (
            "The flat cap did not cost the assured class more than the per-class caps here."
            if flat_unmet <= class_unmet
            else "The flat cap lets the flood spend the tokens the assured class needs; the "
            "per-class caps, set at the measured capacity, keep its share — only as long as "
            "the capacity stays what was measured (E11)."
            if class_unmet == 0
            else "The flat cap lets the flood spend the tokens the assured class needs; the "
            "per-class caps keep more of its share but not all of it: μ_sat is measured on a "
            "queue that never empties, whose batches start nearly in step, and the caps' "
            "Poisson and paced arrivals join batches out of step, where service is longer "
            "(docs/calibration.md, the sustained regime), so caps summing to μ_sat still "
            "overload the backend."
        )
    )
