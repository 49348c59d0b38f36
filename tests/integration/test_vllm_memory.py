"""design §16 on a real vLLM (CPU build) started with a small KV cache: three of its 128-token
blocks (`scripts/vllm_cpu.py serve --kv-blocks 3`). The guard reads that cache from vLLM's
own `cache_config_info` (384 tokens, 128-token blocks). Four requests of 100 prompt tokens
and 60 output tokens each (one block at their start, two by their end) through the guard
dispatching by slots (C = 4) make vLLM preempt — counted by vLLM's own
`vllm:num_preemptions_total` — and through the guard budgeting the 384 tokens (one at a
time: each reserves 256) it preempts none. Both decision logs pass `verify` (MEMORY
included).

The second test is what the preemptions cost the floor: three surplus requests start, then
one floor request arrives. By slots, all four go to vLLM at once; its cache holds three
prompts, so the floor's waits in vLLM's own queue, where the guard's assured-first order
does not reach, behind the surplus sequences vLLM preempts and restarts. Under the budget
the guard keeps the surplus it cannot fit, and the floor request runs next: it waits for at
most one running request, as docs/design.md §6's non-preemptive bound says. The simulator's cache
(`KvBatchingBackend`, vLLM's blocks and victim rule) predicts both on the same arrivals,
scaled to its own service time. Needs `FLOORGUARD_VLLM_PYTHON` as
tests/integration/test_vllm.py does."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.request
from typing import NamedTuple

import aiohttp
import pytest

from floorguard.analysis.checker import check_trace
from floorguard.analysis.records import fold_trace
from floorguard.core.contract import Contract, ContractClass
from floorguard.core.events import EventKind, TraceEvent, read_jsonl
from floorguard.core.request import Request
from floorguard.experiments.real import VLLM_PREEMPTIONS, backend_counters
from floorguard.profiles import get_profile
from floorguard.proxy.pool.health import parse_backend_report
from floorguard.sim.run import scenario_requests, simulate_once
from floorguard.sim.scenarios import ASSURED_TENANT, OPPORTUNISTIC_TENANT, Scenario
from floorguard.sim.workloads import FixedLength, PacedArrivals, SyntheticStream
from tests.integration.live import guard_config, token
from tests.integration.test_vllm import MODEL, SCRIPT, vllm_model, vllm_python
from tests.redis_server import free_port

__all__ = ["vllm_model", "vllm_python"]  # the fixtures this module shares

KV_BLOCKS, BLOCK, SLOTS = 3, 128, 4
BODY = {
    "model": MODEL,
    "prompt": [7] * 100,  # token ids: counted exactly
    "max_tokens": 60,
    "min_tokens": 60,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def small_vllm(vllm_python, vllm_model):
    pid_file = vllm_model / "vllm-small-kv.pid"
    started = subprocess.run(
        [vllm_python, str(SCRIPT), "serve", str(vllm_model), "--port", str(free_port()),
         "--pid-file", str(pid_file), "--name", MODEL, "--max-num-seqs", str(SLOTS),
         "--kv-blocks", str(KV_BLOCKS)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    yield started.stdout.strip().splitlines()[-1]
    subprocess.run([vllm_python, str(SCRIPT), "stop", "--pid-file", str(pid_file)], check=True)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        return answer.read().decode()


def _preemptions(url: str) -> float:
    """vLLM's own count of the sequences its KV cache preempted, as the runner reads it."""
    counters = backend_counters(url)
    assert counters is not None and VLLM_PREEMPTIONS in counters, "vLLM exposes no counter"
    return counters[VLLM_PREEMPTIONS]


def _guard(live, vllm_url, log, budget, contracts):
    """A guard in front of the small vLLM (C = 4), budgeting its 384 tokens or not, with one
    window for the whole test and `contracts`; no doom gate, as the simulator's scenario
    (`doom_gate=False`): the default profile's L is the V100's, not this vLLM's, so its
    drops here would not be proofs (it dropped the floor waiting behind one request, 503)."""
    backend = {"url": vllm_url, "slots": SLOTS}
    if budget:
        backend["kv_tokens"] = KV_BLOCKS * BLOCK
    config = guard_config(
        vllm_url,
        window_s=3600.0,
        decision_log=str(log),
        backends=[backend],
        kv_block_tokens=BLOCK,
        contracts=contracts,
        profile=None,
    )
    return live.guard(config)


async def _four(url: str) -> list[int]:
    headers = {"Authorization": f"Bearer {token('acme')}"}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(url + "/v1/completions", json=BODY, headers=headers) as r:
                await r.read()
                return r.status

        return list(await asyncio.gather(*(one() for _ in range(4))))


@pytest.mark.parametrize("budget", [False, True], ids=["slots-only", "kv-budget"])
def test_vllm_preempts_under_slot_dispatch_and_never_under_the_kv_budget(
    live, small_vllm, tmp_path, budget
):
    report = parse_backend_report(_metrics(small_vllm))
    assert (report.kv_tokens, report.block_tokens) == (KV_BLOCKS * BLOCK, BLOCK)  # vLLM's word
    log = tmp_path / "decisions.jsonl"
    url, app = _guard(
        live,
        small_vllm,
        log,
        budget,
        [{"tenant": "acme", "class": "assured", "floor": 8, "deadline_ms": 30_000}],
    )  # one at a time under the budget: a deadline that waits for the fourth
    before = _preemptions(small_vllm)
    statuses = asyncio.run(_four(url))
    preempted = _preemptions(small_vllm) - before
    live.flush_log(app)
    print(f"vllm:num_preemptions_total rose by {preempted:g}")  # shown with -rP
    assert statuses == [200] * 4
    if budget:
        assert preempted == 0
    else:
        assert preempted > 0
    verified = check_trace(list(read_jsonl(str(log))), allow_open=True)
    assert {v.prop for v in verified.violations} <= {"SF"}, verified.violations[:3]


# -- what the preemptions cost the floor ----------------------------------------------------

SURPLUS = 3
DEADLINE_SERVICES = 2.5
"""The floor's deadline in services of one request alone: under the budget (one at a
time here) it waits for at most the one running request and then runs, two services
(docs/design.md §6's non-preemptive bound at the budget's C = 1), and a quarter each for noise."""
BOUND_SERVICES = 2.0
"""That bound itself. By slots, on vLLM, the floor's sojourn measured 2.3–2.9 services with
one request as the unit (2026-12-05, eight runs) and 2.48–2.59 with the median of three
(four runs): on both sides of the 2.5-service deadline, so whether it misses depends on the
minute (CI failed on 2.37). What holds every time is that it exceeds the bound the budget
keeps (its floor ran in 1.5–1.8 services), so that is what the slots-only run asserts; the
simulator's prediction (2.7 services) misses the deadline, and is asserted to."""


def _behind_the_cache(*, alone_s: float, budget: bool, surplus: int = SURPLUS) -> Scenario:
    """`surplus` requests at 0, 1, 2 … ms, the floor's at a quarter of a service, all of
    100 prompt + 60 output tokens, on C = 4 and a cache of 3 blocks of 128 tokens."""
    out = FixedLength(BODY["max_tokens"])
    prompt = len(BODY["prompt"])
    deadline_s = DEADLINE_SERVICES * alone_s
    floor_stream = SyntheticStream(
        ASSURED_TENANT, PacedArrivals(1.0), out, 1.0, alone_s / 4, prompt_tokens=prompt
    )
    if not surplus:
        return _scenario(deadline_s, budget, (floor_stream,))
    surplus_stream = SyntheticStream(
        OPPORTUNISTIC_TENANT,
        PacedArrivals(1000.0),
        out,
        (surplus - 0.5) / 1000,
        prompt_tokens=prompt,
    )
    return _scenario(deadline_s, budget, (surplus_stream, floor_stream))


def _scenario(deadline_s: float, budget: bool, streams: tuple[SyntheticStream, ...]) -> Scenario:
    return Scenario(
        name="behind-the-cache",
        contracts=(
            Contract(ASSURED_TENANT, ContractClass.ASSURED, deadline_s, 1),
            Contract(OPPORTUNISTIC_TENANT, ContractClass.OPPORTUNISTIC, 600.0),
        ),
        streams=streams,
        profile=get_profile("v100-moe"),
        slots=(SLOTS,),
        doom_gate=False,
        backend_kv_blocks=(KV_BLOCKS,),
        kv_block_tokens=BLOCK,
        kv_tokens=(KV_BLOCKS * BLOCK,) if budget else (),
    )


def _simulated(budget: bool) -> tuple[int, float, float]:
    """The simulator's preemptions, the floor request's sojourn and its deadline (s)."""
    alone = simulate_once(_behind_the_cache(alone_s=1.0, budget=budget, surplus=0), seed=0)
    alone_s = next(iter(fold_trace(alone.events or ()).records)).sojourn_s
    run = simulate_once(_behind_the_cache(alone_s=alone_s, budget=budget), seed=0)
    (floor,) = [r for r in fold_trace(run.events or ()).records if r.tenant == ASSURED_TENANT]
    return run.preemptions, floor.sojourn_s, DEADLINE_SERVICES * alone_s


async def _post(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    started = time.monotonic()
    async with session.post(url + "/v1/completions", json=BODY, headers=headers) as r:
        await r.read()
        assert r.status == 200, r.status
    return time.monotonic() - started


async def _alone_s(url: str) -> float:
    """One request of the workload alone on vLLM: the median of three, after one that
    warms it up (a single one moved by 10 % on this shared machine)."""
    async with aiohttp.ClientSession() as session:
        await _post(session, url, {})
        return sorted([await _post(session, url, {}) for _ in range(3)])[1]


async def _replay(url: str, requests: list[Request]) -> dict[str, float]:
    """Each request fired at its arrival: its sojourn by tenant (the floor's one)."""
    bearer = {
        ASSURED_TENANT: {"Authorization": f"Bearer {token('acme')}"},
        OPPORTUNISTIC_TENANT: {"Authorization": f"Bearer {token('free')}"},
    }
    start = time.monotonic() + 0.2
    async with aiohttp.ClientSession() as session:

        async def one(request: Request) -> tuple[str, float]:
            await asyncio.sleep(start + request.arrival_at - time.monotonic())
            return request.tenant, await _post(session, url, bearer[request.tenant])

        return dict(await asyncio.gather(*(one(r) for r in requests)))


class _Run(NamedTuple):
    started_at: float
    ended_at: float

    @property
    def service_s(self) -> float:
        return self.ended_at - self.started_at


def _first_and_floor(events: list[TraceEvent]) -> tuple[_Run, _Run]:
    """From the decision log: the request that ended first (a surplus one) and the
    floor's, each as its dispatch and its completion."""
    started: dict[str, float] = {}
    runs: dict[str, tuple[str, _Run]] = {}
    for e in events:
        if e.kind is EventKind.DISPATCH:
            started[str(e.request_id)] = e.at
        elif e.kind is EventKind.COMPLETE:
            rid = str(e.request_id)
            runs[rid] = (str(e.tenant), _Run(started[rid], e.at))
    first = min((run for _, run in runs.values()), key=lambda run: run.ended_at)
    (floor,) = [run for tenant, run in runs.values() if tenant == "acme"]
    return first, floor


@pytest.mark.parametrize("budget", [False, True], ids=["slots-only", "kv-budget"])
def test_the_floor_waits_in_vllms_queue_by_slots_and_runs_on_time_under_the_kv_budget(
    live, small_vllm, tmp_path, budget
):
    alone_s = asyncio.run(_alone_s(small_vllm))
    scenario = _behind_the_cache(alone_s=alone_s, budget=budget)
    (contract, _) = scenario.contracts
    log = tmp_path / "decisions.jsonl"
    url, app = _guard(
        live, small_vllm, log, budget,
        [{"tenant": "acme", "class": "assured", "floor": 1,
          "deadline_ms": contract.deadline_budget_s * 1e3},
         {"tenant": "free", "class": "opportunistic", "deadline_ms": 600_000}],
    )  # fmt: skip
    before = _preemptions(small_vllm)
    sojourn = asyncio.run(_replay(url, scenario_requests(scenario, seed=0)))
    preempted = _preemptions(small_vllm) - before
    live.flush_log(app)
    floor_s, deadline_s = sojourn[ASSURED_TENANT], contract.deadline_budget_s
    sim_preempted, sim_floor_s, sim_deadline_s = _simulated(budget)
    print(
        f"alone {alone_s:.2f} s; vLLM: {preempted:g} preemptions, the floor's sojourn "
        f"{floor_s:.2f} s of d = {deadline_s:.2f} s; simulator: {sim_preempted} "
        f"preemptions, {sim_floor_s:.2f} s of d = {sim_deadline_s:.2f} s"
    )  # shown with -rP
    events = list(read_jsonl(log))
    if budget:
        # One at a time under the budget: the first surplus request ran alone in vLLM, so
        # its service is one service at this run's speed (the machine is shared: a slow
        # minute stretches every service alike, and the guard cannot make up for it).
        first, floor = _first_and_floor(events)
        service_s = max(alone_s, first.service_s)
        print(f"this run's service {first.service_s:.2f} s; the floor started "
              f"{floor.started_at - first.ended_at:+.3f} s after the first end")  # fmt: skip
        assert preempted == 0
        assert abs(floor.started_at - first.ended_at) <= 0.1 * service_s  # behind one, no more
        assert floor_s <= DEADLINE_SERVICES * service_s
        assert sim_preempted == 0 and sim_floor_s <= sim_deadline_s
    else:
        assert preempted > 0 and floor_s > BOUND_SERVICES * alone_s
        assert sim_preempted > 0 and sim_floor_s > sim_deadline_s
    verified = check_trace(events, allow_open=True)
    assert {v.prop for v in verified.violations} <= {"SF"}, verified.violations[:3]
