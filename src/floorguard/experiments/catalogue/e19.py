"""E19: output-length scaling."""

from __future__ import annotations

import math
from collections.abc import Sequence

from floorguard.experiments.conditions import Condition
from floorguard.experiments.records import RunRow, Summary
from floorguard.experiments.spec import Experiment
from floorguard.experiments.tables import summarize
from floorguard.profiles import get_profile
from floorguard.sim.targets import saturated_capacity

_E19_FLOOR = 2
_E19_WINDOWS = 12
"""Windows of arrivals per E19 cell, whatever the window's length."""


def _e19_window_s(tokens: int, slots: int = 4) -> float:
    """The shortest window, in whole half-seconds and at least 1 s, that keeps
    ρ_a = B·s_max(ℓ)/(C·W) ≤ 1 (docs/design.md §11: E19 is the clean line, not an overload)."""
    s_max = get_profile("v100-moe").ceiling.at(tokens)
    return max(1.0, math.ceil(_E19_FLOOR * s_max / slots * 2) / 2)


def _e19(quick: bool) -> list[Condition]:
    out = []
    for t in (16, 64, 128, 256):
        window_s = _e19_window_s(t)
        out.append(
            Condition(
                tokens=t,
                floor=_E19_FLOOR,
                window_s=window_s,
                assured_rate=_E19_FLOOR / window_s,
                duration_s=_E19_WINDOWS * window_s,
                deadline_ms=1e6,
                doom_gate=False,
            )
        )
    return out


def _e19_extra(rows: Sequence[RunRow]) -> str:
    profile = get_profile("v100-moe")
    lines = [
        "| ℓ | W (s) | full-batch service (ms) | 183 + 14.9·ℓ (ms) | s_max(ℓ) (ms) | ρ_a | "
        "§6 d needed (ms) | measured assured p99 sojourn, max over runs (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summarize(rows):
        tokens = s["tokens"]
        s_max = profile.ceiling.at(tokens)
        service = saturated_capacity(profile, tokens, s["slots"])[1]
        rho_a = s["floor"] * s_max / (s["slots"] * s["window_s"])
        bound = s_max * (1 + -(-s["floor"] // s["slots"]))
        lines.append(
            f"| {tokens} | {s['window_s']:g} | {service * 1e3:.0f} | {183 + 14.9 * tokens:.0f} | "
            f"{s_max * 1e3:.0f} | {rho_a:.2f} | {bound * 1e3:.0f} | "
            f"{s['sojourn_p99_ms']:.0f} |"
        )
    return "\n".join(lines)


def _e19_bound_ms(s: Summary) -> float:
    s_max = get_profile(s["profile"]).ceiling.at(s["tokens"])
    return float(s_max * (1 + -(-s["floor"] // s["slots"])) * 1e3)


def _e19_reading(rows: Sequence[RunRow]) -> str:
    summaries = summarize(rows)
    parts = []
    for s in summaries:
        s_max = get_profile(s["profile"]).ceiling.at(s["tokens"])
        rho_a = s["floor"] * s_max / (s["slots"] * s["window_s"])
        clean_ms = 2 * (183 + 14.9 * s["tokens"])
        parts.append(
            f"ℓ = {s['tokens']} (W {s['window_s']:g} s, ρ_a {rho_a:.2f}): measured p99 "
            f"{s['sojourn_p99_ms']:.0f} ms vs the clean line's 2·(183 + 14.9·ℓ) = "
            f"{clean_ms:.0f} ms and §6's {_e19_bound_ms(s):.0f} ms"
        )
    over = [s["tokens"] for s in summaries if (s["sojourn_p99_ms"] or 0.0) > _e19_bound_ms(s)]
    return "; ".join(parts) + (
        f". The measured p99 exceeds the §6 deadline at ℓ ∈ {over} with ρ_a ≤ 1: there the "
        "bound's s_max(ℓ), scaled along the full-batch line, is short of what a wave behind "
        "a running opportunistic job takes."
        if over
        else ". With ρ_a ≤ 1 at every ℓ the measured p99 stays under the §6 deadline, and "
        "the deadline the floor needs grows linearly in ℓ, as the clean line does."
    )


E19 = Experiment(
    "E19",
    "Output-length scaling",
    "ℓ ∈ {16, 64, 128, 256} for both classes, B = 2 (⌈B/C⌉ = 1), C = 4, v100-moe, on the "
    "clean line rather than an overload (docs/design.md §11): the window W grows with ℓ so that "
    "ρ_a = B·s_max(ℓ)/(C·W) ≤ 1 at every ℓ (the shortest whole half-second, at least 1 s), "
    "the assured stream paced B per W, 12 windows of arrivals, the 16/s flood beside it; no "
    "deadline pressure (d = 10⁶ ms, no doom gate) so the sojourn is measured whole; reps 5. "
    "The deadline the floor needs: the measured p99 beside the clean line's "
    "2·(183 + 14.9·ℓ) and docs/design.md §6's s_max(ℓ)·(1 + ⌈B/C⌉).",
    _e19,
    reps=5,
    shown=("tokens",),
    extra=_e19_extra,
    reading=_e19_reading,
)
