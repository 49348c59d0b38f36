"""`floorguard experiment run E1 E3 E4 E5 E8 --backend URL --model NAME`: the experiments on
a real OpenAI-compatible backend (vLLM), each condition beside the simulator's prediction for
the same calibrated profile and the same arrivals — the fidelity table. The conditions are
the catalogue's short grids written for v100-moe (`REFERENCE_PROFILE`); 9 reps each, so a
clean condition's Clopper–Pearson upper bound on its late-run share is 0.336.

**Scaling.** The catalogue's conditions are written for the v100-moe profile. On another
backend they are rescaled by its measured capacity: with
`k = μ_sat(v100-moe, C) / μ_sat(backend)` (both at ℓ = 16), every arrival rate is divided by
`k` and the window `W` and the run length are multiplied by `k`, so the offered load against
capacity (ρ̂), the arrivals per window against the floor `B` and the requests per run stay
what they were. Deadlines are time too, and scale by the same `k`: `k` is the ratio of
the two backends' measured sustained services (with `C` slots saturated, a request's mean
service is `C / μ_sat`: ≈ 452 ms on v100-moe at ℓ = 16), so a deadline stays the same
multiple of the measured service it was published at (E8's 1284–900 ms are 2.8–2.0 of
v100-moe's; the marquee's 1820 ms is 4.0). Scaling them by the calibrated ceiling `s_max`
instead put them at 1.5–2.2 measured services on the CPU build, whose ceiling sits close to
its mean service where v100-moe's is 1.5× it — another region than the published one.
The exception is a deadline the catalogue writes as the region's bound (E21, E22:
`s_max(64, p)·(1 + ⌈B/C⌉)`, docs/design.md §6): it keeps its factor over the backend's own
calibrated ceiling for the condition's request, `d = factor · s_max_backend(ℓ, p)`, so the
row stays inside the region on that backend. The prompt `p` matters only where a profile
charges for it: v100-moe charges nothing, a CPU build's calibration ≈ 1.2 s per 100 tokens.

**The stacks on a real backend.** E3's FIFO run cannot take replayed decisions from a real
guard; it runs the same learner, and its row says whether its admitted set matched the
assured-first run's of the same seed (`admission_identical`). The simulator's side replays.

* `guard`, `gated-fifo`: a `floorguard serve` process in front of the backend (dispatch
  assured-first or fifo, the learner and its options from the condition, tenant from a
  trusted header). Its decision log is checked afterwards (AF, DR, SF by its own clock).
* `server-priority`: every request straight to the backend with vLLM's `priority`
  (assured 0, opportunistic 1): vLLM's own scheduler. It never sees a deadline, so one run
  per rep is measured against each of E8's deadlines.
* `unguarded`: the learner's admission, then FIFO — the simulator's `UnguardedStack`, driven
  here on the wall clock; it forwards a request when one of the `C` slots is free, which is
  what the backend's own FIFO queue would do.

**Memory (E21, E22)** runs alone, on a backend started with a small KV cache (vLLM CPU:
`scripts/vllm_cpu.py serve --kv-blocks N`), and with `--profile` from a calibration on a full
cache (the calibration's long prompts do not fit a small one). Only the conditions written
for the cache the backend reports (`cache_config_info`, in tokens) run, in the backend's
own blocks (the CPU build's 128 tokens for the catalogue's 16), and so does the simulator's
cache. Each request's 100-token prompt is sent as token ids, so the backend holds exactly
the tokens the guard meters; vLLM's own `num_preemptions` counter, read before and after
each run, is set beside the simulator's.

The simulator then runs every scaled condition on the calibrated profile with the same seeds.
Real runs are sequential (one backend); each lasts its arrivals plus the drain of its backlog.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from floorguard.analysis.checker import check_trace
from floorguard.analysis.metrics import measure
from floorguard.baselines.unguarded import UnguardedStack
from floorguard.calibrate import calibrate
from floorguard.clock import WallClock
from floorguard.core.contract import ContractClass, GuardConfig
from floorguard.core.events import read_jsonl
from floorguard.core.request import Request
from floorguard.core.surface import Drop
from floorguard.errors import FloorguardError
from floorguard.experiments.conditions import (
    Condition,
    build_scenario,
    first_token_row,
    learner_options_of,
    load_of,
    measured_row,
    mu_sat_of,
)
from floorguard.experiments.fidelity import (
    RealResult,
    fidelity_report,
    fidelity_table,
    paired_differences,
    served_runs,
    sim_service,
)
from floorguard.experiments.figures import real_vs_sim
from floorguard.experiments.report import write_real_section
from floorguard.experiments.runner import Task, plan, run_tasks, write_rows
from floorguard.experiments.spec import Experiment, Row
from floorguard.experiments.tables import CONDITION_FIELDS
from floorguard.learners.registry import create_learner
from floorguard.profiles import ServiceProfile, get_profile, load_measured
from floorguard.proxy.config.guard import GuardServerConfig
from floorguard.proxy.pool.health import parse_backend_report
from floorguard.proxy.pool.pump import Pump
from floorguard.rig.loadgen import ClientResult, client_records, post_completion, replay
from floorguard.rig.net import free_ports
from floorguard.sim.run import scenario_requests
from floorguard.sim.scenarios import ASSURED_TENANT, KV_PROMPT_TOKENS, OPPORTUNISTIC_TENANT

__all__ = [
    "MEMORY_EXPERIMENTS",
    "OWN_SECTION",
    "REAL_EXPERIMENTS",
    "VLLM_PREEMPTIONS",
    "RealBackend",
    "backend_counters",
    "backend_times",
    "holds_cache_of",
    "run_on_backend",
    "run_real_experiments",
    "scaled",
    "wait_ready",
    "write_fidelity",
]

REAL_EXPERIMENTS = ("E1", "E3", "E4", "E5", "E8", "E21", "E22", "E23")
MEMORY_EXPERIMENTS = frozenset({"E21", "E22"})
OWN_SECTION = {"E21": "memory pressure", "E22": "memory pressure", "E23": "first tokens"}
"""Experiments that run alone on a backend and have a section of the results file of their
own (`--results-md`); the rest share the fidelity section."""
"""Run on a backend started with a small KV cache, apart from the others (which need one
that never preempts): only the conditions whose cache is the backend's own run."""
REAL_REPS = 9
"""Every condition runs 9 reps: one with no late assured request in 9 of 9 runs has a
Clopper–Pearson 95 % upper bound of 0.336 on its late-run share (the target: under 0.35)."""
REFERENCE_PROFILE = "v100-moe"
"""On a real backend only the conditions written for this profile run (the backend is one
node; another profile's conditions would only rescale time)."""
POLICIES = frozenset({"guard", "gated-fifo", "server-priority", "unguarded"})
DEADLINE_BLIND = frozenset({"server-priority"})
"""Stacks whose run does not depend on the deadline (measured against each)."""
TENANT_HEADER = "X-Floorguard-Tenant"
PRIORITY = {
    ASSURED_TENANT: {"priority": ContractClass.ASSURED.backend_priority},
    OPPORTUNISTIC_TENANT: {"priority": ContractClass.OPPORTUNISTIC.backend_priority},
}
"""The body vLLM's own scheduler gets in the server-priority runs (the core's class map)."""


@dataclass(frozen=True)
class RealBackend:
    url: str
    model: str
    profile_path: Path
    """Its calibrated profile (`floorguard calibrate --out`)."""
    mu_sat_per_s: float
    """Its measured saturated capacity at ℓ = 16 (from the profile file)."""
    kv_tokens: int | None = None
    """Its KV cache in tokens, as its `/metrics` reports it (None: it reports none)."""
    kv_block_tokens: int | None = None

    @classmethod
    def from_profile(cls, url: str, model: str, profile_path: Path) -> RealBackend:
        measured = load_measured(profile_path)
        mu_sat = measured.get("mu_sat_per_s")
        if not isinstance(mu_sat, int | float) or mu_sat <= 0:
            raise FloorguardError(
                f"{profile_path} has no measured.mu_sat_per_s: write it with floorguard calibrate"
            )
        url = url.rstrip("/")
        report = parse_backend_report(_metrics_text(url) or "")
        return cls(url, model, profile_path, float(mu_sat), report.kv_tokens, report.block_tokens)

    @property
    def profile(self) -> ServiceProfile:
        return get_profile(str(self.profile_path))


def _metrics_text(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def holds_cache_of(c: Condition, backend: RealBackend) -> bool:
    """A memory condition runs on the backend whose KV cache is the one it is written for
    (in tokens; the backend's own blocks stand for the catalogue's 16-token ones)."""
    return c.workload != "kv-pressure" or backend.kv_tokens == c.kv_blocks * c.kv_block_tokens


def scaled(c: Condition, backend: RealBackend, duration_s: float | None = None) -> Condition:
    """`c` rescaled to `backend` (module docstring); `duration_s` overrides the run length."""
    k = mu_sat_of(c.profile, c.slots) / backend.mu_sat_per_s
    deadline_ms = c.deadline_ms * k
    if c.workload == "kv-pressure":  # written as the region's bound: keep d / s_max(ℓ, p)
        shape = (c.tokens, prompt_tokens_of(c))
        factor = c.deadline_ms / 1e3 / get_profile(c.profile).ceiling.at(*shape)
        deadline_ms = factor * backend.profile.ceiling.at(*shape) * 1e3
        if backend.kv_tokens and backend.kv_block_tokens:
            block = backend.kv_block_tokens
            c = replace(c, kv_blocks=backend.kv_tokens // block, kv_block_tokens=block)
    return replace(
        c,
        profile=str(backend.profile_path),
        assured_rate=c.assured_rate / k,
        opp_rate=c.opp_rate / k,
        window_s=c.window_s * k,
        duration_s=duration_s if duration_s is not None else c.duration_s * k,
        deadline_ms=deadline_ms,
        ttft_ms=c.ttft_ms * k,  # first-token terms are time too
        tpot_ms=c.tpot_ms * k,
    )


def prompt_tokens_of(c: Condition) -> int:
    """The prompt each of `c`'s requests carries, as the simulator meters it."""
    return KV_PROMPT_TOKENS if c.workload == "kv-pressure" else 0


# -- one run on the real backend ------------------------------------------------------------


def _guard_config(c: Condition, backend: RealBackend, port: int, log: Path) -> GuardServerConfig:
    """The `floorguard serve` config for one run, validated by the server's own model."""
    deadline = {"deadline_ms": c.deadline_ms}
    first = (  # E23: the floor's contract in first-token terms, due at ttft + tpot·ℓ
        {"ttft_ms": c.ttft_ms, "tpot_ms": c.tpot_ms} if c.ttft_ms > 0 and c.tpot_ms > 0 else {}
    )
    kv = {"kv_tokens": c.kv_blocks * c.kv_block_tokens} if c.kv_budget else {}  # E21 only
    return GuardServerConfig.model_validate(
        {
            "port": port,
            "window_s": c.window_s,
            "contracts": [
                {
                    "tenant": ASSURED_TENANT,
                    "class": "assured",
                    "floor": c.floor,
                    "excess_policy": c.excess,
                    **(first or deadline),
                },
                {"tenant": OPPORTUNISTIC_TENANT, "class": "opportunistic", **deadline},
            ],
            "backends": [{"url": backend.url, "slots": c.slots, **kv}],
            "kv_block_tokens": c.kv_block_tokens,
            "reserved_slots": c.reserved_slots,
            "forward_priority": c.forward_priority,
            "identity": {
                "mode": "header",
                "header": TENANT_HEADER,
                "trusted_upstreams": ["127.0.0.0/8"],
            },
            "learner": c.learner,
            "learner_options": {"beta": c.beta, "slo_ms": c.deadline_ms, "fit": c.predictor},
            "profile": str(backend.profile_path),
            "doom_gate": c.doom_gate,
            "dispatch": "fifo" if c.policy == "gated-fifo" else "assured-first",
            "upstream": {"first_byte_timeout_s": 600, "idle_timeout_s": 600},
            "drain_timeout_s": 5,
            "decision_log": str(log),
        }
    )


def wait_ready(url: str, child: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until a `floorguard serve` child answers `/readyz` 200 (FloorguardError if it exits
    first or is not ready within `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise FloorguardError(f"floorguard serve exited with {child.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise FloorguardError(f"floorguard serve at {url} was not ready in {timeout_s:.0f} s")


def _streamed(c: Condition) -> dict[str, Any]:
    """The body field that streams a condition's answers: E23 measures first tokens."""
    return {"stream": True} if c.ttft_ms > 0 else {}


def _window_start(window_s: float) -> float:
    """The next window boundary at least a second away: the guard's windows are aligned to
    the epoch (`origin_at: 0`), and the simulator's runs start at a boundary too."""
    return math.ceil((time.time() + 1.0) / window_s) * window_s


def _through_guard(
    c: Condition, backend: RealBackend, requests: list[Request], folder: Path
) -> tuple[list[ClientResult], dict[str, Any]]:
    port = free_ports()[0]
    log = folder / "decisions.jsonl"
    log.unlink(missing_ok=True)
    config_path = folder / "guard.yaml"
    config = _guard_config(c, backend, port, log)
    config_path.write_text(
        yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_unset=True))
    )
    url = f"http://127.0.0.1:{port}"
    with (folder / "guard.log").open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "floorguard", "serve", "--config", str(config_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_ready(url, child)
            headers = {t: {TENANT_HEADER: t} for t in (ASSURED_TENANT, OPPORTUNISTIC_TENANT)}
            results = asyncio.run(
                replay(
                    requests,
                    url,
                    headers,
                    start_at=_window_start(c.window_s),
                    model=backend.model,
                    body_for={t: _streamed(c) for t in headers},
                    exact_prompts=True,
                )
            )
        finally:
            child.terminate()  # SIGTERM: drains (nothing is left) and flushes the log
            child.wait(30)
    report = check_trace(list(read_jsonl(str(log))))
    return results, {
        "log_violations": len(report.failed()),  # AF, DR, order, slots, terminal
        "log_sf_late": report.num_sf_late,
    }


async def _unguarded(
    c: Condition, backend: RealBackend, requests: list[Request], seed: int
) -> list[ClientResult]:
    """The learner's admission and a FIFO of `C` slots: the simulator's `UnguardedStack`,
    driven on the wall clock by the HTTP guard's pump."""
    learner = create_learner(
        c.learner, np.random.default_rng(seed).spawn(3)[2], learner_options_of(c)
    )
    stack = UnguardedStack(build_scenario(c).guard_config(), learner=learner)
    url = backend.url + "/v1/completions"
    clock = WallClock(origin_at=_window_start(c.window_s))
    pump = Pump(stack, clock)

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
    ) as session:

        async def offer(request: Request) -> ClientResult:
            await asyncio.sleep(max(0.0, request.arrival_at - clock.now()))
            fired = time.time()

            def result(status: int, first_at: float | None = None) -> ClientResult:
                scheduled = clock.origin_at + request.arrival_at
                return ClientResult(
                    request, scheduled, fired, time.time(), status, first_token_at=first_at
                )

            rid = request.request_id
            if not stack.on_arrival(request, clock.now()).admitted:
                return result(429)
            if isinstance(await pump.turn(rid), Drop):
                return result(503)
            answer = await post_completion(
                session, url, request, model=backend.model, extra=_streamed(c), exact_prompts=True
            )
            if answer.status == 200:
                stack.finish(rid, clock.now(), "complete")
            else:
                stack.finish(rid, clock.now(), "fail", f"http_{answer.status}")
            pump.pump()
            return result(answer.status, answer.first_at)

        try:
            return list(await asyncio.gather(*(offer(r) for r in requests)))
        finally:
            pump.close()


def _serve_real(
    c: Condition, seed: int, backend: RealBackend, folder: Path
) -> tuple[list[ClientResult], dict[str, Any]]:
    requests = scenario_requests(build_scenario(c), seed)
    if c.policy in ("guard", "gated-fifo"):
        return _through_guard(c, backend, requests, folder)
    if c.policy == "server-priority":
        results = asyncio.run(
            replay(
                requests,
                backend.url,
                {},
                start_at=_window_start(c.window_s),
                model=backend.model,
                body_for={t: {**body, **_streamed(c)} for t, body in PRIORITY.items()},
                exact_prompts=True,
            )
        )
        return results, {}
    return asyncio.run(_unguarded(c, backend, requests, seed)), {}


VLLM_PREEMPTIONS = "vllm:num_preemptions"
"""vLLM's counter of the sequences its KV cache preempted (0.32 declares its family with
the `_total` suffix; the parser names it either way)."""
VLLM_TIMES = {
    "vllm:request_inference_time_seconds": "backend_service",
    "vllm:request_queue_time_seconds": "backend_queue",
}
"""vLLM's own per-request histograms: the time a request ran (scheduled to finished) and the
time it waited in vLLM's queue."""


def backend_counters(url: str) -> dict[str, float] | None:
    """The sums and counts of vLLM's request-time histograms from `url/metrics`, over all
    its series; None when the backend exposes none (the emulator, another server)."""
    text = _metrics_text(url)
    if text is None:
        return None
    counters: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name in (VLLM_PREEMPTIONS, f"{VLLM_PREEMPTIONS}_total"):
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        counters[VLLM_PREEMPTIONS] = (
                            counters.get(VLLM_PREEMPTIONS, 0.0) + sample.value
                        )
            if family.name in VLLM_TIMES:
                for sample in family.samples:
                    if sample.name.endswith(("_sum", "_count")):
                        counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
    except ValueError:  # not Prometheus text
        return None
    return counters or None


def backend_times(before: dict[str, float] | None, after: dict[str, float] | None) -> Row:
    """What vLLM measured during one run: its requests, their mean running time and mean
    queue time (None where it exposes no metrics). The service is the figure to hold
    against the simulator's: the backend's speed during the run, in its own words."""
    row: Row = {
        "backend_requests": None,
        "backend_service_mean_s": None,
        "backend_queue_mean_s": None,
        "backend_preemptions": None,
    }
    if before is None or after is None:
        return row

    def change(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    for family, stem in VLLM_TIMES.items():
        if (count := change(f"{family}_count")) > 0:
            row[f"{stem}_mean_s"] = change(f"{family}_sum") / count
    if (ran := change("vllm:request_inference_time_seconds_count")) > 0:
        row["backend_requests"] = int(ran)
    if VLLM_PREEMPTIONS in after:
        row["backend_preemptions"] = int(change(VLLM_PREEMPTIONS))
    return row


def real_row(c: Condition, seed: int, results: Sequence[ClientResult], backend: RealBackend) -> Row:
    """One real run as a row with the simulator's keys (those a client can measure)."""
    config: GuardConfig = build_scenario(c).guard_config()
    records = client_records(results, config)
    m = measure(records)
    rho_emp, rho_hat = load_of(m, backend.mu_sat_per_s)
    first = results[0].scheduled_at - results[0].request.arrival_at if results else 0.0
    return {
        **(first_token_row(c, records, origin_at=first) if c.ttft_ms > 0 else {}),
        **measured_row(c, seed, m),
        "attainment": m.attainment,
        "mu_sat": backend.mu_sat_per_s,
        "rho_hat": rho_hat,
        "rho_emp": rho_emp,
        "goodput_per_s": m.goodput_per_s,
        "span_s": m.span_s,
        "fire_cv": m.fire_cv,
        "max_fire_lag_s": m.max_fire_lag_s,
        "statuses": dict(Counter(str(r.status) for r in results)),
        "phase_counts": [list(p) for p in m.phase_counts],
    }


# -- the whole suite ------------------------------------------------------------------------


class _RealRuns:
    """The real side of the suite, one run at a time on the one backend. A deadline-blind
    stack's run is served once per (condition sans deadline, seed) and measured against each
    deadline; E3's FIFO run says whether its admitted set matched the assured-first run's of
    the same seed (a real guard takes no replayed decisions), whichever of the two ran
    first."""

    def __init__(self, backend: RealBackend, out: Path) -> None:
        self.backend = backend
        self.out = out
        self.blind: dict[tuple[str, Condition, int], tuple[list[ClientResult], Row]] = {}
        self.admitted_by: dict[tuple[str, Condition, int], frozenset[object]] = {}
        self.waiting: dict[tuple[str, Condition, int], tuple[Row, frozenset[object]]] = {}
        """FIFO rows whose pair's guard run comes after them (paired order, odd reps)."""

    def __call__(self, task: Task) -> Row:
        c, seed = task.condition, task.seed
        folder = self.out / task.experiment_id / "runs" / f"c{task.index}-r{task.rep}"
        folder.mkdir(parents=True, exist_ok=True)
        blind = replace(c, deadline_ms=0.0, ttft_ms=0.0, tpot_ms=0.0)
        key = (task.experiment_id, blind, seed)
        extra: Row = {"log_violations": None, "log_sf_late": None, "served": False}
        if c.policy in DEADLINE_BLIND and key in self.blind:
            results, measured = self.blind[key]  # the same run, measured against this deadline
            extra.update(measured)
        else:
            before = backend_counters(self.backend.url)
            results, checked = _serve_real(c, seed, self.backend, folder)
            measured = backend_times(before, backend_counters(self.backend.url))
            extra.update({**checked, **measured, "served": True})
            if c.policy in DEADLINE_BLIND:
                self.blind[key] = (results, measured)
        admitted = frozenset(r.request.request_id for r in results if r.status != 429)
        pair = (task.experiment_id, replace(c, policy="guard", replay_admission=False), seed)
        row = {**real_row(c, seed, results, self.backend), **extra}
        if c.policy == "guard":
            self.admitted_by[pair] = admitted
            if pair in self.waiting:  # the FIFO run of this pair ran first (an odd rep)
                fifo_row, fifo_admitted = self.waiting.pop(pair)
                fifo_row["admission_identical"] = fifo_admitted == admitted
        if c.replay_admission:
            if pair in self.admitted_by:
                row["admission_identical"] = self.admitted_by[pair] == admitted
            else:
                row["admission_identical"] = False  # until the guard's run of the pair says
                self.waiting[pair] = (row, admitted)
        return row


def paired(tasks: Sequence[Task]) -> list[Task]:
    """The real runs in paired order (docs/design.md §11 "Real backend"): an experiment's reps one
    after another, each rep's stacks back to back on the same arrivals (one seed per rep),
    the stacks' order alternating between reps (the grid's order on even reps, reversed on
    odd), so a backend whose speed drifts shifts both sides of a pair alike."""
    experiments = list(dict.fromkeys(t.experiment_id for t in tasks))
    out: list[Task] = []
    for experiment_id in experiments:
        mine = [t for t in tasks if t.experiment_id == experiment_id]
        policies = list(dict.fromkeys(t.condition.policy for t in mine))
        for rep in sorted({t.rep for t in mine}):
            order = policies if rep % 2 == 0 else policies[::-1]
            of_rep = [t for t in mine if t.rep == rep]
            out += sorted(of_rep, key=lambda t: (order.index(t.condition.policy), t.index))
    return out


def run_real_experiments(
    experiments: Sequence[Experiment],
    backend: RealBackend,
    *,
    out: Path,
    reps: int | None = None,
    quick: bool = False,
    duration_s: float | None = None,
    console: Console | None = None,
) -> list[RealResult]:
    """Every (condition × rep) of `experiments` on `backend`, then on the simulator. The
    grids are the catalogue's short ones (E1: β ∈ {0, 1}); reps 9, or 1 with `quick`."""
    console = console or Console(stderr=True)
    unknown = [e.id for e in experiments if e.id not in REAL_EXPERIMENTS]
    if unknown:
        raise FloorguardError(
            f"{unknown} run on the simulator only; on a real backend: {' '.join(REAL_EXPERIMENTS)}"
        )
    memory = {e.id for e in experiments} & MEMORY_EXPERIMENTS
    if memory and len(experiments) > len(memory):
        raise FloorguardError(
            f"{' '.join(sorted(memory))} run alone, on a backend started with a small KV cache "
            "(docs/vllm.md); the others need one that never preempts"
        )
    own = {e.id for e in experiments} & set(OWN_SECTION)
    if own and len(experiments) > len(own):
        raise FloorguardError(
            f"{' '.join(sorted(own))} run alone: each has a section of the results of its own"
        )
    tasks = plan(
        experiments,
        lambda _: reps if reps is not None else 1 if quick else REAL_REPS,
        quick=True,  # the short grids (module docstring)
        select=lambda c: c.profile == REFERENCE_PROFILE and holds_cache_of(c, backend),
        transform=lambda c: scaled(c, backend, duration_s),
    )
    if memory and not tasks:
        caches = sorted(
            {c.kv_blocks * c.kv_block_tokens for e in experiments for c in e.grid(True)}
        )
        raise FloorguardError(
            f"{backend.url} reports a KV cache of {backend.kv_tokens} tokens; "
            f"{' '.join(sorted(memory))} runs on one of {caches} tokens (vLLM CPU: "
            "scripts/vllm_cpu.py serve --kv-blocks N, N × 128 tokens)"
        )
    for task in tasks:
        if task.condition.policy not in POLICIES:
            raise FloorguardError(f"policy {task.condition.policy} has no real-backend form")
    real = run_tasks(
        paired(tasks),
        _RealRuns(backend, out),
        console=console,
        label=f"real runs on {backend.url}",
    )
    grid_order = {task.key: i for i, task in enumerate(tasks)}
    real.sort(key=lambda d: grid_order[d.task.key])  # the rows in grid order, as the sim's
    sim = run_tasks(tasks, console=console, label="simulator predictions")
    rows: dict[str, tuple[list[Row], list[Row]]] = {e.id: ([], []) for e in experiments}
    for side, finished in enumerate((real, sim)):
        for d in finished:
            rows[d.task.experiment_id][side].append({**d.row, "condition": d.task.index})
    done = []
    for experiment in experiments:
        real_rows, sim_ran = rows[experiment.id]
        sim_rows = [{**row, **sim_service(row)} for row in sim_ran]
        folder = out / experiment.id
        write_rows(real_rows, folder, "real_runs")
        write_rows(sim_rows, folder, "sim_runs")
        table = fidelity_table(experiment, real_rows, sim_rows)
        if pairs := paired_differences(experiment, real_rows, CONDITION_FIELDS):
            table += "\n\n" + pairs
        (folder / "fidelity.md").write_text(f"# {experiment.id}: {experiment.title}\n\n{table}\n")
        done.append(RealResult(experiment, real_rows, sim_rows, table))
    return done


def describe(backend: RealBackend, c: Condition, duration_s: float | None = None) -> str:
    """The scaling applied to `c` (catalogue defaults) on `backend`, in one paragraph;
    `duration_s` is the run length where `--duration-s` set it."""
    s = scaled(c, backend, duration_s)
    reference = get_profile(c.profile)
    k = mu_sat_of(c.profile, c.slots) / backend.mu_sat_per_s
    name, ell, prompt = c.workload, c.tokens, prompt_tokens_of(c)
    shape = f"{ell}, p = {prompt}" if prompt else f"{ell}"
    if c.workload == "kv-pressure":
        deadlines = (
            f"deadlines keep d / s_max({shape}) ({name} "
            f"{c.deadline_ms / 1e3 / reference.ceiling.at(ell, prompt):.2f} → "
            f"d = {s.deadline_ms:.0f} ms)."
        )
    else:
        ours, theirs = c.slots / backend.mu_sat_per_s, c.slots / mu_sat_of(c.profile, c.slots)
        deadlines = (
            f"deadlines × k too, the same multiple of the measured sustained service C / μ_sat "
            f"(v100-moe {theirs * 1e3:.0f} ms, this backend {ours * 1e3:.0f} ms; {name} "
            f"{c.deadline_ms / 1e3 / theirs:.2f} services → d = {s.deadline_ms:.0f} ms)."
        )
    return (
        f"Backend {backend.url} (model `{backend.model}`), profile `{backend.profile_path}`: "
        f"measured μ_sat {backend.mu_sat_per_s:.2f}/s at ℓ = 16, C = {c.slots} "
        f"(the simulator on this profile: {mu_sat_of(s.profile, c.slots):.2f}/s); "
        f"s_max({shape}) {backend.profile.ceiling.at(ell, prompt) * 1e3:.0f} ms "
        f"(v100-moe: {reference.ceiling.at(ell, prompt) * 1e3:.0f} ms). "
        f"k = μ_sat(v100-moe) / μ_sat = {k:.2f}: rates ÷ k, W and run length × k "
        f"({name}: W = {s.window_s:.2f} s, assured {s.assured_rate:.2f}/s, opportunistic "
        f"{s.opp_rate:.2f}/s, {s.duration_s:.1f} s); " + deadlines
    )


def run_on_backend(
    experiments: list[Experiment],
    url: str,
    model: str,
    *,
    profile: Path | None,
    out: Path,
    reps: int | None,
    quick: bool,
    duration_s: float | None,
    results_md: Path | None,
    command: str,
    console: Console,
) -> Path:
    """`floorguard experiment run … --backend URL`: calibrate the backend unless `profile`
    is given, run the experiments there beside the simulator's prediction, draw the figure
    and write `OUT/fidelity.md` (and the fidelity section of `results_md`). Returns the
    report's path."""
    if duration_s is not None and duration_s <= 0:
        raise FloorguardError(f"--duration-s = {duration_s}: must be > 0")
    out.mkdir(parents=True, exist_ok=True)
    if profile is None:
        slots = experiments[0].grid(True)[0].slots
        console.print(f"calibrating {url} ({model}, C = {slots})…", markup=False)
        calibrated = calibrate(url, model, slots=slots, name=model)
        profile = out / "profile.yaml"
        calibrated.save(profile, backend=url, model=model, slots=slots)
    backend = RealBackend.from_profile(url, model, profile)
    started = time.perf_counter()
    results = run_real_experiments(
        experiments,
        backend,
        out=out,
        reps=reps,
        quick=quick,
        duration_s=duration_s,
        console=console,
    )
    wall_s = time.perf_counter() - started
    return write_fidelity(
        results,
        backend,
        out=out,
        command=command,
        wall_s=wall_s,
        results_md=results_md,
        console=console,
    )


def write_fidelity(
    results: Sequence[RealResult],
    backend: RealBackend,
    *,
    out: Path,
    command: str,
    wall_s: float,
    results_md: Path | None,
    console: Console,
) -> Path:
    """The figure and `OUT/fidelity.md` of a real run's results (and its section of
    `results_md`: E1–E8's, or E21's own); `scripts/rerender_fidelity.py` calls it on a
    run's saved rows. Returns the report's path."""
    points = [p for r in results for p in r.points()]
    real_vs_sim(points, out / "fidelity.png")
    memory = " ".join(r.experiment.id for r in results if r.experiment.id in MEMORY_EXPERIMENTS)
    alone = " ".join(r.experiment.id for r in results if r.experiment.id in OWN_SECTION)
    first = results[0].experiment.grid(True)[0]
    ran = [float(r["duration_s"]) for r in results[0].real if memory and "duration_s" in r]
    scaling = describe(backend, first if memory else Condition(), ran[0] if ran else None)
    if memory:
        scaling += (
            f" The backend's KV cache: {backend.kv_tokens} tokens in blocks of "
            f"{backend.kv_block_tokens} (its `cache_config_info`); the simulator's cache is "
            "the same."
        )
    title = f"{OWN_SECTION[alone.split()[0]]} ({alone})" if alone else "fidelity of the simulator"
    body = fidelity_report(
        results,
        scaling,
        command=command,
        wall_s=wall_s,
        figure="fidelity.png",
        title=title,
    )
    report = out / "fidelity.md"
    report.write_text(body + "\n")
    console.print(f"wrote {report} ({served_runs(results)} runs on the backend, {wall_s:.0f} s)")
    if results_md is not None:
        figure = (
            results_md.parent
            / "figures"
            / (f"fidelity_{alone}_real_vs_sim.png" if alone else "fidelity_real_vs_sim.png")
        )
        figure.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "fidelity.png", figure)
        body = fidelity_report(
            results,
            scaling,
            command=command,
            wall_s=wall_s,
            figure=str(figure.relative_to(results_md.parent)),
            title=title,
        )
        write_real_section(results_md, body, alone)
        console.print(f"wrote the real-backend section of {results_md} and {figure}")
    return report
