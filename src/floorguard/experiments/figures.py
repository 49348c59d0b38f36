"""PNG figures (matplotlib, Agg). Each takes an experiment's rows and a folder, returns the
file it wrote. matplotlib is imported when a figure is drawn, never at import: it needs a
writable cache directory, which a read-only container (`serve`, `--version`) has not."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from floorguard.analysis.plot import subplots
from floorguard.experiments.records import RunRow
from floorguard.experiments.tables import source_name, summarize

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from floorguard.datacenter import FleetResult

__all__ = [
    "attainment_vs_phase",
    "completion_vs_arrival",
    "cv_vs_miss",
    "fleet_figure",
    "priority_vs_fifo",
    "real_vs_sim",
    "region_heatmap",
]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _miss(row: RunRow) -> float:
    admitted = row["a_admitted"]
    return row["a_late"] / admitted if admitted else math.nan


def completion_vs_arrival(rows: Sequence[RunRow], out: Path) -> Path:
    """E1: assured completion time against arrival, deadline line, at the β where the
    unguarded twin misses most; the guard run and the unguarded run share their arrivals."""
    with_detail = [r for r in rows if r.get("detail") is not None]
    unguarded = [r for r in with_detail if r["policy"] == "unguarded"]
    worst = max(unguarded, key=_miss) if unguarded else None
    fig, axes = subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, policy in zip(axes, ("guard", "unguarded"), strict=True):
        run = next(
            (
                r
                for r in with_detail
                if worst is not None
                and r["policy"] == policy
                and r["beta"] == worst["beta"]
                and r["seed"] == worst["seed"]
            ),
            None,
        )
        if run is None:
            continue
        d = run["deadline_ms"] / 1e3
        detail = run["detail"]
        assert not isinstance(detail, bool), "E1's grid keeps each request's detail"
        done = [(a, e) for a, e, outcome, _ in detail if outcome == "completed" and e is not None]
        late = [(a, e) for a, e in done if e - a > d]
        ok = [(a, e) for a, e in done if e - a <= d]
        refused = [a for a, _, outcome, _ in detail if outcome != "completed"]
        if ok:
            ax.scatter(*zip(*ok, strict=True), s=10, color="tab:blue", label="on time")
        if late:
            ax.scatter(*zip(*late, strict=True), s=10, color="tab:red", label="late")
        if refused:
            ax.scatter(
                refused,
                refused,
                s=14,
                marker="x",
                color="gray",
                label="refused or dropped (at arrival)",
            )
        xs = np.linspace(0, max(a for a, *_ in detail) + 0.5, 2)
        ax.plot(xs, xs + d, "k--", lw=1, label=f"deadline (d = {d * 1e3:.0f} ms)")
        ax.set_title(f"{policy}, β = {run['beta']:g} (seed {run['seed']})")
        ax.set_xlabel("arrival time (s)")
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("completion time (s)")
    return _save(fig, out / "e1_completion_vs_arrival.png")


def priority_vs_fifo(rows: Sequence[RunRow], out: Path) -> Path:
    """E3: assured miss and worst p99 sojourn over offered load, assured-first vs FIFO at
    identical admission."""
    fig, axes = subplots(1, 2, figsize=(9, 3.8))
    summaries = summarize(rows)
    policies = (("guard", "assured-first"), ("gated-fifo", "FIFO"))
    learners = list(dict.fromkeys(s["learner"] for s in summaries))
    for learner, style in zip(learners, ("-", "--", ":")[: len(learners)], strict=True):
        for policy, label in policies:
            mine = sorted(
                (s for s in summaries if (s["policy"], s["learner"]) == (policy, learner)),
                key=lambda s: s["rho_hat"] or 0.0,
            )
            rho = [s["rho_hat"] for s in mine]
            name = f"{label}, {learner}"
            axes[0].plot(rho, [s["miss"].estimate or 0 for s in mine], "o" + style, label=name)
            axes[1].plot(rho, [s["sojourn_p99_ms"] or 0 for s in mine], "o" + style, label=name)
    deadline = rows[0]["deadline_ms"] if rows else 0
    axes[1].axhline(deadline, color="k", ls="--", lw=1, label="deadline")
    axes[0].set_ylabel("assured miss (late / admitted)")
    axes[1].set_ylabel("assured p99 sojourn, worst run (ms)")
    for ax in axes:
        ax.set_xlabel("offered load ρ̂ (offered / μ_sat)")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    return _save(fig, out / "e3_priority_vs_fifo.png")


def region_heatmap(rows: Sequence[RunRow], out: Path) -> Path:
    """E7: assured miss over (ρ_eff, d); cells inside docs/design.md §6's region outlined."""
    summaries = summarize(rows)
    floors = sorted({s["floor"] for s in summaries})
    deadlines = sorted({s["deadline_ms"] for s in summaries})
    grid = np.full((len(deadlines), len(floors)), np.nan)
    inside = np.zeros_like(grid, dtype=bool)
    rho: dict[int, list[float]] = {}
    for s in summaries:
        i, j = deadlines.index(s["deadline_ms"]), floors.index(s["floor"])
        grid[i, j] = s["miss"].estimate if s["miss"].estimate is not None else np.nan
        inside[i, j] = s["inside_region"]
        rho.setdefault(s["floor"], []).append(s["rho_eff"] or 0)
    fig, ax = subplots(figsize=(7.5, 5))
    image = ax.imshow(
        grid, origin="lower", cmap="Reds", vmin=0, vmax=max(0.05, np.nanmax(grid)), aspect="auto"
    )
    for i in range(len(deadlines)):
        for j in range(len(floors)):
            ax.text(
                j,
                i,
                "–" if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=7,
            )
            if inside[i, j]:
                box = _rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2.2, ec="tab:blue")
                ax.add_patch(box)
    ax.set_xticks(
        range(len(floors)), [f"B={b}\nρ_eff={np.mean(rho[b]):.2f}" for b in floors], fontsize=7
    )
    ax.set_yticks(range(len(deadlines)), [f"{d:.0f}" for d in deadlines])
    ax.set_ylabel("deadline budget d (ms)")
    ax.set_title("assured miss (guard); blue outline: inside the docs/design.md §6 region")
    fig.colorbar(image, ax=ax, label="assured miss")
    return _save(fig, out / "e7_operating_region.png")


def cv_vs_miss(rows: Sequence[RunRow], out: Path) -> Path:
    """E12: realized interarrival CV of each trace slice against its assured miss."""
    sources = sorted({r["trace_path"] for r in rows})
    fig, axes = subplots(1, len(sources), figsize=(4.2 * len(sources), 3.8), squeeze=False)
    for ax, source in zip(axes[0], sources, strict=True):
        for policy, marker in (("guard", "o"), ("unguarded", "^")):
            runs = [
                r
                for r in rows
                if r["trace_path"] == source and r["policy"] == policy and r["excess"] == "reject"
            ]
            ax.scatter(
                [r["fire_cv"] or 0 for r in runs],
                [_miss(r) for r in runs],
                s=14,
                marker=marker,
                label=policy,
            )
        ax.set_title(source_name(source), fontsize=9)
        ax.set_xlabel("slice interarrival CV")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("assured miss")
    return _save(fig, out / "e12_cv_vs_miss.png")


def attainment_vs_phase(rows: Sequence[RunRow], out: Path) -> Path:
    """E13: floor-entitled attainment as the contract's window origin shifts by φ."""
    fig, ax = subplots(figsize=(7, 4))
    groups: dict[str, dict[float, list[int]]] = {}
    for r in rows:
        label = f"{r['policy']}, {r['workload']}" + (
            f", β={r['beta']:g}" if r["workload"] == "marquee" else ""
        )
        phases = groups.setdefault(label, {})
        for phase, met, entitled in r["phase_counts"]:
            pooled = phases.setdefault(phase, [0, 0])
            pooled[0] += met
            pooled[1] += entitled
    for label, phases in sorted(groups.items()):
        xs = sorted(phases)
        ax.plot(
            [x * 1e3 for x in xs],
            [phases[x][0] / phases[x][1] if phases[x][1] else np.nan for x in xs],
            marker=".",
            label=label,
        )
    ax.set_xlabel("contract window origin offset φ (ms)")
    ax.set_ylabel("floor-entitled attainment")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    return _save(fig, out / "e13_attainment_vs_phase.png")


def real_vs_sim(points: Sequence[tuple[str, float | None, float | None, float, float]],
                path: Path) -> Path:  # fmt: skip
    """The fidelity plot: per condition (experiment id, real and simulated assured p99 in
    ms, real and simulated assured unmet), real against simulated, with the diagonal."""
    fig, (p99, unmet) = subplots(1, 2, figsize=(9, 4))
    markers = dict(zip(sorted({p[0] for p in points}), "osD^v", strict=False))
    for experiment, marker in markers.items():
        mine = [p for p in points if p[0] == experiment]
        timed = [(real, sim) for _, real, sim, *_ in mine if real and sim]
        if timed:
            p99.scatter([s for _, s in timed], [r for r, _ in timed], marker=marker,
                        label=experiment)  # fmt: skip
        unmet.scatter([p[4] for p in mine], [p[3] for p in mine], marker=marker, label=experiment)
    timed_all = [v for p in points for v in p[1:3] if v]
    if timed_all:
        low, high = min(timed_all) / 1.3, max(timed_all) * 1.3
        p99.plot([low, high], [low, high], color="grey", lw=0.8, ls="--")
        p99.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    p99.set(xlabel="simulator: assured p99 sojourn (ms)", ylabel="real backend (ms)")
    unmet.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    unmet.set(xlabel="simulator: assured unmet", ylabel="real backend", xlim=(-0.03, 1.03),
              ylim=(-0.03, 1.03))  # fmt: skip
    for ax in (p99, unmet):
        ax.legend(loc="upper left")
    fig.suptitle("Each condition on the real backend against the simulator's prediction")
    return _save(fig, path)


def _rectangle(*args: Any, **kwargs: Any) -> Any:
    from matplotlib.patches import Rectangle  # noqa: PLC0415 (only when drawing)

    return Rectangle(*args, **kwargs)


def fleet_figure(results: Sequence[FleetResult], path: Path) -> Path:
    """Partitioned against leased slots across the load balancer's skew: the fleet's slot
    utilization and opportunistic goodput (left), the assured p99 sojourn (right)."""
    fig, (left, right) = subplots(1, 2, figsize=(11, 4.2))
    for mode, color in (("partition", "tab:orange"), ("leased", "tab:blue")):
        runs = sorted((r for r in results if r.fleet.slot_mode == mode), key=lambda r: r.fleet.skew)
        if not runs:
            continue
        skews = [r.fleet.skew for r in runs]
        left.plot(skews, [r.utilization for r in runs], marker="o", color=color, label=mode)
        right.plot(skews, [r.assured_p99_ms for r in runs], marker="o", color=color, label=mode)
    f = results[0].fleet
    left.set(
        xlabel="load-balancer skew s (replica r's share ∝ (r+1)^−s)",
        ylabel="busy slot-seconds / fleet slot-seconds",
        ylim=(0, 1.05),
        title="Slot utilization",
    )
    right.set(
        xlabel="load-balancer skew s",
        ylabel="floor-admitted assured p99 sojourn (ms)",
        title=f"Assured p99 (deadline {f.deadline_ms:.0f} ms)",
    )
    right.axhline(f.deadline_ms, color="gray", ls=":", lw=1)
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{f.replicas} replicas × {f.backends} backends (C = {f.slots}) × {f.tenants} assured "
        f"tenants, flood at 2× capacity",
        fontsize=10,
    )
    return _save(fig, path)
