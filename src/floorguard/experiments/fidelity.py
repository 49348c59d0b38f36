"""The fidelity section of the results: each real-backend condition beside the
simulator's prediction for the same calibrated profile and the same arrivals, through the
experiments' table kit, with how far apart the two sides are and how far the backend's own
speed was from its calibration during the runs (`experiments/real.py` makes the rows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from floorguard.analysis.metrics import UNMET_OUTCOMES, UNMET_TEXT
from floorguard.analysis.stats import clopper_pearson
from floorguard.experiments.spec import Experiment, Row
from floorguard.experiments.tables import markdown_table, mean_of, pooled

__all__ = [
    "DRIFT",
    "RealResult",
    "admission",
    "drift",
    "fidelity_report",
    "fidelity_summaries",
    "fidelity_table",
    "guard_misses",
    "paired_differences",
    "served_runs",
    "service_mean",
    "sim_service",
    "speed_ratios",
]


UNMET = tuple(f"a_{outcome}" for outcome in UNMET_OUTCOMES)
FIDELITY_COLUMNS = [
    ("runs", "runs"),
    ("miss_real", "A miss real"),
    ("miss_sim", "sim"),
    ("unmet_real", "A unmet real"),
    ("unmet_sim", "sim"),
    ("attainment_real", "floor attainment real"),
    ("attainment_sim", "sim"),
    ("p99_ms_real", "A p99 ms real"),
    ("p99_ms_sim", "sim"),
    ("goodput_real", "goodput /s real"),
    ("goodput_sim", "sim"),
    ("service_ms_real", "service mean ms, vLLM's own"),
    ("service_ms_sim", "sim"),
    ("late_runs", "runs with a late A, real (CP 95 %)"),
    ("rho_hat", "ρ̂ real"),
    ("rho_at_speed", "ρ̂ at vLLM's speed"),
    ("log", "log check"),
]
FIRST_TOKEN_COLUMNS = [
    ("ttft_real", "floor's first tokens on time, real"),
    ("ttft_sim", "sim"),
    ("ttft_p99_real", "A TTFT p99 ms real"),
    ("ttft_p99_sim", "sim"),
    ("surplus_real", "surplus tokens/s real"),
    ("surplus_sim", "sim"),
]
"""E23's (a condition with a TTFT): first tokens and what the surplus produced."""
DRIFT = 0.25
"""A run whose backend service (vLLM's own figure) is more than this far from the
simulator's for the same arrivals ran on a backend faster or slower than its calibration."""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _side(rows: Sequence[Row]) -> dict[str, float | None]:
    return {
        "miss": pooled(rows, ("a_late",), "a_admitted"),
        "unmet": pooled(rows, UNMET, "a_offered"),
        "attainment": pooled(rows, ("entitled_met",), "entitled"),
        "p99_ms": _ms(mean_of(rows, "a_sojourn_p99_s")),
        "goodput": mean_of(rows, "goodput_per_s"),
        "service_ms": _ms(service_mean(rows)),
    }


def _first_tokens(rows: Sequence[Row]) -> dict[str, Any]:
    """A condition's first tokens over its reps (E23's measures, `first_token_row`)."""
    met, entitled = sum(r["ttft_met"] for r in rows), sum(r["ttft_entitled"] for r in rows)
    p99 = [r["a_ttft_p99_s"] for r in rows if r["a_ttft_p99_s"] is not None]
    return {
        "ttft": f"{met}/{entitled} ({met / entitled:.0%})" if entitled else None,
        "ttft_p99": float(np.mean(p99)) * 1e3 if p99 else None,
        "surplus": mean_of(rows, "o_tokens_per_s"),
    }


def _groups(real: Sequence[Row], sim: Sequence[Row]) -> dict[int, tuple[list[Row], list[Row]]]:
    groups: dict[int, tuple[list[Row], list[Row]]] = {}
    for rows, side in ((real, 0), (sim, 1)):
        for row in rows:
            groups.setdefault(row["condition"], ([], []))[side].append(row)
    return dict(sorted(groups.items()))


def fidelity_summaries(
    experiment: Experiment, real: Sequence[Row], sim: Sequence[Row]
) -> list[dict[str, Any]]:
    """Per condition: each measure on the real backend and the simulator's prediction (same
    profile, same arrivals), pooled over reps; the guard's own log check."""
    out = []
    for real_rows, sim_rows in _groups(real, sim).values():
        late, n = sum(r["a_late"] > 0 for r in real_rows), len(real_rows)
        logged = [r for r in real_rows if r["log_violations"] is not None]
        out.append(
            {
                **dict(zip(experiment.shown, _label(experiment, real_rows[0]), strict=True)),
                "runs": n,
                **{f"{k}_real": v for k, v in _side(real_rows).items()},
                **{f"{k}_sim": v for k, v in _side(sim_rows).items()},
                **(
                    {
                        **{f"{k}_real": v for k, v in _first_tokens(real_rows).items()},
                        **{f"{k}_sim": v for k, v in _first_tokens(sim_rows).items()},
                    }
                    if "ttft_entitled" in real_rows[0]
                    else {}
                ),
                "late_runs": f"{late}/{n} {clopper_pearson(late, n).fmt()}",
                "rho_hat": mean_of(real_rows, "rho_hat"),
                "rho_at_speed": _rho_at_speed(real_rows, sim_rows),
                "log": (
                    f"{sum(r['log_violations'] for r in logged)} violations; "
                    f"SF late {sum(r['log_sf_late'] for r in logged)}"
                    if logged
                    else None
                ),
            }
        )
    return out


def _rho_at_speed(real: Sequence[Row], sim: Sequence[Row]) -> float | None:
    """ρ̂ against the capacity the backend had during each run rather than at calibration:
    with `C` slots capacity goes as 1 / service, so ρ̂ × (vLLM's mean service ÷ the
    simulator's for the same arrivals), averaged over the runs that have both."""
    values = [row["rho_hat"] * x for row, x in _service_ratios(real, sim)]
    return float(np.mean(values)) if values else None


def fidelity_table(experiment: Experiment, real: Sequence[Row], sim: Sequence[Row]) -> str:
    """The fidelity table (the experiments' table kit), then how far apart the two sides
    are and how far the backend's speed was from its calibration."""
    first = FIRST_TOKEN_COLUMNS if real and "ttft_entitled" in real[0] else []
    columns = FIDELITY_COLUMNS[:1] + first + FIDELITY_COLUMNS[1:]
    table = markdown_table(experiment, fidelity_summaries(experiment, real, sim), columns)
    groups = _groups(real, sim)
    parts = (
        table,
        preemptions(experiment, real, sim),
        guard_misses(experiment, groups),
        first_tokens(experiment, groups),
        _agreement(experiment, groups),
        admission(real),
        drift(real, sim),
    )
    return "\n\n".join(part for part in parts if part)


def preemptions(experiment: Experiment, real: Sequence[Row], sim: Sequence[Row]) -> str:
    """For a memory experiment (E21): each condition's preemptions, counted by the backend
    itself (vLLM's `num_preemptions`, read before and after each run) beside the simulator's
    cache's for the same arrivals, summed over reps; '' for the others."""
    if not any(r.get("workload") == "kv-pressure" for r in real):
        return ""
    lines = [
        "| " + " | ".join([*experiment.shown, "preemptions real (vLLM's)", "sim"]) + " |",
        "|" + "---|" * (len(experiment.shown) + 2),
    ]
    for real_rows, sim_rows in _groups(real, sim).values():
        counted = [
            r["backend_preemptions"] for r in real_rows if r.get("backend_preemptions") is not None
        ]
        label = _label(experiment, real_rows[0])
        real_cell = str(sum(counted)) if counted else "–"
        sim_cell = str(sum(int(r.get("preemptions", 0)) for r in sim_rows))
        lines.append("| " + " | ".join([*map(str, label), real_cell, sim_cell]) + " |")
    return "\n".join(lines)


PAIR_KEY_EXCLUDES = frozenset({"policy", "learner", "replay_admission"})
"""Fields two stacks of one comparison may differ in: a pair is every other field equal,
the same seed."""


def _pair_key(row: Row, fields: Sequence[str]) -> tuple[Any, ...]:
    return (row["seed"], *(row[f] for f in fields))


def _interval(values: Sequence[float]) -> str:
    """Mean and its 95 % t interval over the reps' paired differences."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return f"{mean:+.3f} (1 rep: no interval)"
    half = stats.t.ppf(0.975, len(values) - 1) * float(np.std(values, ddof=1)) / len(values) ** 0.5
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def paired_differences(experiment: Experiment, real: Sequence[Row], fields: Sequence[str]) -> str:
    """Per condition of a two-stack comparison, the per-rep paired difference (first stack
    in the grid's order minus the second, the same seed, run back to back) in A miss and in
    goodput, with its 95 % t interval; '' when the experiment compares fewer than two
    stacks. `fields` are the condition's fields (the pair key is them less
    `PAIR_KEY_EXCLUDES`)."""
    policies = list(dict.fromkeys(r["policy"] for r in real))
    if len(policies) != 2:
        return ""
    first, second = policies
    key_fields = [f for f in fields if f not in PAIR_KEY_EXCLUDES]
    shown = [i for i, f in enumerate(experiment.shown) if f not in PAIR_KEY_EXCLUDES]
    seconds = {_pair_key(r, key_fields): r for r in real if r["policy"] == second}
    cells: dict[tuple[str, ...], list[tuple[Row, Row]]] = {}
    for row in real:
        other = seconds.get(_pair_key(row, key_fields)) if row["policy"] == first else None
        if other is not None:
            label = tuple(_label(experiment, row)[i] for i in shown)
            cells.setdefault(label, []).append((row, other))
    if not cells:
        return ""

    def miss(row: Row) -> float:
        return row["a_late"] / row["a_admitted"] if row["a_admitted"] else 0.0

    lines = [
        f"Paired, {first} − {second} (each rep's two runs back to back on the same arrivals, "
        "the order alternating between reps; mean over reps [95 % t interval]):",
        "",
        "| "
        + " | ".join([*(experiment.shown[i] for i in shown), "reps", "A miss", "goodput /s"])
        + " |",
        "|" + "---|" * (len(shown) + 3),
    ]
    for label, pairs in cells.items():
        lines.append(
            "| "
            + " | ".join(
                [
                    *label,
                    str(len(pairs)),
                    _interval([miss(a) - miss(b) for a, b in pairs]),
                    _interval(
                        [(a["goodput_per_s"] or 0) - (b["goodput_per_s"] or 0) for a, b in pairs]
                    ),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def admission(real: Sequence[Row]) -> str:
    """Whether the replayed-admission runs (E3's FIFO) admitted what the assured-first run
    of the same seed admitted, in one sentence ('' when no row replays admission)."""
    runs = [r["admission_identical"] for r in real if "admission_identical" in r]
    if not runs:
        return ""
    same = sum(bool(x) for x in runs)
    text = (
        f"The FIFO runs admitted exactly the assured-first run's set of the same seed in "
        f"{same} of {len(runs)} runs"
    )
    if same == len(runs):
        return text + ": the two orders were compared on identical admission."
    return text + (
        ": a real guard takes no replayed decisions, and the learner reads the guard's load, "
        "which the dispatch order changes, so elsewhere the two orders were compared on "
        "similar, not identical, admission (the simulator's side replays it exactly)."
    )


def guard_misses(experiment: Experiment, groups: dict[int, tuple[list[Row], list[Row]]]) -> str:
    """Each condition's deadline in the backend's own measured service during its runs
    (vLLM's mean), and where a guard's assured requests were late, why: the condition against
    docs/design.md §6's region on the calibrated profile (the simulator's rows carry it) and
    what the simulator predicts there. '' when the backend reports no service."""
    multiples = [
        r[0]["deadline_ms"] / 1e3 / service
        for r, _ in groups.values()
        if (service := service_mean(r)) and r[0]["workload"] not in ("kv-pressure", "chat-flood")
    ]
    if not multiples:
        return ""
    text = (
        f"Deadlines in vLLM's own mean service during their runs: {min(multiples):.2f}–"
        f"{max(multiples):.2f} (the published E8 deadlines are 2.0–2.8 of theirs). "
    )
    late = []
    for r, s in groups.values():
        guarded = any(x["log_violations"] is not None for x in r)
        miss = pooled(r, ("a_late",), "a_admitted") or 0.0
        if not guarded or miss == 0.0:
            continue
        label = " ".join(_label(experiment, r[0]))
        d_ms, bound_s = r[0]["deadline_ms"], max(x["bound_s"] for x in s)
        inside = all(x["inside_region"] for x in s)
        sim_miss = pooled(s, ("a_late",), "a_admitted") or 0.0
        service = service_mean(r)
        where = f"{label}: {miss:.3f}" + (
            f" at d = {d_ms / 1e3 / service:.2f} services" if service else ""
        )
        if not inside:
            why = (
                f"outside the region on the calibrated profile (its bound "
                f"{bound_s * 1e3:.0f} ms against d = {d_ms:.0f} ms, or another of §6's "
                "assumptions), where the floor is not guaranteed; "
                + (
                    f"the simulator predicts {sim_miss:.3f}"
                    if sim_miss
                    else "the simulator predicts none"
                )
            )
        elif sim_miss:
            why = f"inside the region, and the simulator predicts {sim_miss:.3f} there too"
        else:
            why = (
                "inside the region, where the simulator predicts none: the backend served "
                "slower than its calibrated envelope during those runs"
            )
        late.append(f"{where} ({why})")
    if not late:
        return text + "The guard had no late assured request."
    return text + "Where the guard's assured requests were late: " + "; ".join(late) + "."


def first_tokens(experiment: Experiment, groups: dict[int, tuple[list[Row], list[Row]]]) -> str:
    """E23's reading from its own table: the floor's first tokens on time per condition, real
    and simulated, and what each reservation cost the surplus against the guard without one
    of the same cell ('' for conditions without a TTFT)."""
    rows = [(r, s) for r, s in groups.values() if r and "ttft_entitled" in r[0]]
    if not rows:
        return ""

    def share(side: Sequence[Row]) -> str:
        met, entitled = sum(x["ttft_met"] for x in side), sum(x["ttft_entitled"] for x in side)
        return f"{met / entitled:.0%}" if entitled else "–"

    def cell(row: Row) -> tuple[Any, ...]:
        return tuple(row[f] for f in ("floor", "ttft_ms"))

    base = {
        cell(r[0]): (mean_of(r, "o_tokens_per_s"), mean_of(s, "o_tokens_per_s"))
        for r, s in rows
        if r[0]["policy"] == "guard" and r[0]["reserved_slots"] == 0
    }
    on_time = "; ".join(f"{' '.join(_label(experiment, r[0]))}: {share(r)} (sim {share(s)})"
                        for r, s in rows)  # fmt: skip
    costs = []
    for r, s in rows:
        if r[0]["policy"] == "guard" and r[0]["reserved_slots"] and cell(r[0]) in base:
            real0, sim0 = base[cell(r[0])]
            real, sim = mean_of(r, "o_tokens_per_s"), mean_of(s, "o_tokens_per_s")
            if real and sim and real0 and sim0:
                costs.append(
                    f"r = {r[0]['reserved_slots']}: {real / real0:.2f}× the surplus tokens/s of "
                    f"the guard without reserved slots (sim {sim / sim0:.2f}×)"
                )
    return (
        "The floor's first tokens on time: "
        + on_time
        + "."
        + (" What the reservation cost the surplus: " + "; ".join(costs) + "." if costs else "")
    )


def _label(experiment: Experiment, row: Row) -> list[str]:
    """The condition's shown fields as the grid writes them (0.5, 1284: not 0.500, 1284.3)."""
    return [f"{row[f]:.4g}" if isinstance(row[f], float) else str(row[f]) for f in experiment.shown]


def _agreement(experiment: Experiment, groups: dict[int, tuple[list[Row], list[Row]]]) -> str:
    """How far apart the two sides are, in one sentence."""

    def miss(rows: Sequence[Row]) -> float:
        return pooled(rows, ("a_late",), "a_admitted") or 0.0

    worst, where = max(
        (abs(miss(r) - miss(s)), " ".join(_label(experiment, r[0]))) for r, s in groups.values()
    )
    verdicts = sum(
        (sum(x["a_late"] for x in r) == 0) == (sum(x["a_late"] for x in s) == 0)
        for r, s in groups.values()
    )
    p99 = [
        abs(real / sim - 1)
        for r, s in groups.values()
        if (real := mean_of(r, "a_sojourn_p99_s")) and (sim := mean_of(s, "a_sojourn_p99_s"))
    ]
    return (
        f"Largest |real − sim| in A miss: {worst:.3f} ({where}). Real and simulated runs "
        f"agree on whether any assured request was late in {verdicts} of {len(groups)} "
        f"conditions; A p99 differs by a median {np.median(p99) * 100:.0f} % "
        f"(max {max(p99) * 100:.0f} %)."
        if p99
        else f"Largest |real − sim| in A miss: {worst:.3f} ({where})."
    )


def _service_ratios(real: Sequence[Row], sim: Sequence[Row]) -> list[tuple[Row, float]]:
    """Per real row with vLLM's figure: (the row, vLLM's mean service ÷ the simulator's for
    the same condition and seed). A deadline-blind row carries its served run's figure."""
    predicted = {(r["condition"], r["rep"]): r["backend_service_mean_s"] for r in sim}
    out = []
    for row in real:
        mine = row.get("backend_service_mean_s")
        theirs = predicted.get((row["condition"], row["rep"]))
        if mine is not None and theirs:
            out.append((row, mine / theirs))
    return out


def speed_ratios(real: Sequence[Row], sim: Sequence[Row]) -> list[tuple[Row, float]]:
    """Per served real run: (its row, vLLM's mean service ÷ the simulator's for the same
    condition and seed)."""
    return [(row, x) for row, x in _service_ratios(real, sim) if row["served"]]


def drift(real: Sequence[Row], sim: Sequence[Row]) -> str:
    """The backend's speed during the runs against the simulator's, in one sentence ('' when
    the backend exposes no service figures)."""
    ratios = speed_ratios(real, sim)
    if not ratios:
        return ""
    values = [x for _, x in ratios]
    off = [(row, x) for row, x in ratios if abs(x - 1) > DRIFT]
    text = (
        f"The backend's own mean service (vLLM's `request_inference_time`) was "
        f"{min(values):.2f}–{max(values):.2f} × the simulator's for the same arrivals "
        f"(median {np.median(values):.2f}); "
    )
    if not off:
        return text + f"no run was more than {DRIFT:.0%} off it."
    named = ", ".join(f"c{row['condition']} rep {row['rep']} ({x:.2f})" for row, x in off[:8])
    more = f" and {len(off) - 8} more" if len(off) > 8 else ""
    faster = sum(x < 1 for _, x in off)
    return text + (
        f"**{len(off)} of {len(values)} runs were more than {DRIFT:.0%} off it** ({faster} "
        f"faster, {len(off) - faster} slower): {named}{more} — the backend ran at another "
        "speed than at its calibration there, so those rows test another backend than the "
        "one the simulator predicts (*ρ̂ at vLLM's speed* is the load against the capacity "
        "it had)."
    )


def _weighted_mean(parts: Sequence[tuple[int, float]]) -> tuple[int, float | None]:
    """(total weight, the mean weighted by it; None when the weight is 0)."""
    n = sum(k for k, _ in parts)
    return n, sum(k * m for k, m in parts) / n if n else None


def sim_service(row: Row) -> Row:
    """The simulator's counterpart of `backend_times`: its completed requests and their
    mean service (both classes)."""
    n, mean = _weighted_mean(
        [
            (row[f"{c}_completed"], row[f"{c}_service_mean_s"])
            for c in "ao"
            if row[f"{c}_completed"] and row[f"{c}_service_mean_s"] is not None
        ]
    )
    return {
        "backend_requests": n or None,
        "backend_service_mean_s": mean,
        "backend_queue_mean_s": None,
    }


def service_mean(rows: Sequence[Row]) -> float | None:
    """The backend's mean service over `rows`, weighted by their requests."""
    return _weighted_mean(
        [
            (r["backend_requests"], r["backend_service_mean_s"])
            for r in rows
            if r.get("backend_requests") and r.get("backend_service_mean_s") is not None
        ]
    )[1]


@dataclass
class RealResult:
    experiment: Experiment
    real: list[Row]
    sim: list[Row]
    table_md: str

    def points(self) -> list[tuple[str, float | None, float | None, float, float]]:
        """Per condition: (id, real A p99 ms, sim A p99 ms, real A unmet, sim A unmet)."""
        out = []
        for index in sorted({r["condition"] for r in self.real}):
            real = [r for r in self.real if r["condition"] == index]
            sim = [r for r in self.sim if r["condition"] == index]
            out.append(
                (
                    self.experiment.id,
                    _ms(mean_of(real, "a_sojourn_p99_s")),
                    _ms(mean_of(sim, "a_sojourn_p99_s")),
                    pooled(real, UNMET, "a_offered") or 0.0,
                    pooled(sim, UNMET, "a_offered") or 0.0,
                )
            )
        return out


def served_runs(results: Sequence[RealResult]) -> int:
    """How many runs the backend served (a deadline-blind run counts once)."""
    return sum(bool(row["served"]) for r in results for row in r.real)


def fidelity_report(
    results: Sequence[RealResult],
    scaling: str,
    *,
    command: str,
    wall_s: float,
    figure: str | None = None,
    title: str = "fidelity of the simulator",
) -> str:
    """The fidelity section: how it was made, `scaling` (the paragraph saying how the
    conditions were rescaled to the backend), one table per experiment, and `figure` (a path
    relative to the report) when given."""
    lines = [
        f"## On a real backend: {title}",
        "",
        f"Generated by `{command}` in {wall_s:.0f} s: {served_runs(results)} runs on the backend "
        f"({sum(len(r.real) for r in results)} condition × rep rows"
        + (
            ": vLLM's priority run of a rep is measured against each of E8's deadlines"
            if any(r.experiment.id == "E8" for r in results)
            else ""
        )
        + "), then the simulator on the same conditions and seeds. Real measures are the "
        "client's (a request's arrival is when it was fired; a 503 drop or 429 rejection is "
        "unmet); *sim* is the simulator's prediction for the calibrated profile with the same "
        "arrivals. Pooled over reps: A miss = late / admitted, A "
        f"{UNMET_TEXT}, floor attainment = floor-entitled requests met / entitled; "
        "A p99 and goodput (completions on time per second, both classes) are means over reps. "
        "*log check*: the guard's decision log through `floorguard verify`'s checker: "
        "violations of AF, DR, dispatch order, slots and terminal outcomes (must be 0), and "
        "floor-entitled requests late by the guard's clock (SF, conditional: docs/design.md §6). "
        "*service mean, vLLM's own*: the mean time a request ran in vLLM during the run (its "
        "`request_inference_time` histogram, read from its `/metrics` before and after), "
        "beside the simulator's mean service: where the two differ, the backend ran at "
        "another speed than its calibration and the row tests another backend.",
        "",
        scaling,
        "",
    ]
    if figure is not None:
        lines += [f"![real against simulated]({figure})", ""]
    for r in results:
        lines += [f"### {r.experiment.id}: {r.experiment.title}", "", r.table_md, ""]
    return "\n".join(lines).rstrip("\n")
