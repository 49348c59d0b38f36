"""The offline trace checker (docs/design.md §8): verify a decision log against its own config.

Safety properties, each with a finite bad prefix, are checked in log order and the first
violation's position is reported:

* AF       every assured arrival that fits its window's remaining floor is admitted entitled,
           and no window grants more than `B` (recomputed from arrival times, the config's
           `W`, `t0` and meter; the guard's own window field is not trusted);
* DR       every drop satisfies `t + L(ℓ, p) > D` with the config's lower envelope (`p`: the
           prompt's tokens, its lower bound where the count was only bounded), or, for a
           contract with a TTFT, `t + L(0, p) > T` (its first token doomed: design §19);
* ORDER    assured-first: no surplus request starts while a floor-entitled one waits;
           FIFO: requests start in admission order (a doomed one may leave whenever it
           is doomed: docs/design.md §12);
* SLOTS    no backend ever has more than its `C` in flight (and, across a fleet's logs, no
           backend more than its own capacity summed over the replicas);
* MEMORY   under a KV budget (design §16), no backend ever holds reservations (metered prompt
           + output cap, in whole blocks) beyond its `kv_tokens`;
* REQUEUE  (not a property) a request whose backend was unreachable frees its slot and waits
           again at the front of its queue;
* TERMINAL every arrival ends in exactly one terminal outcome (reject, drop, complete, fail,
           abort), and nothing ends twice or without arriving.

SF (an entitled request completes by its deadline) is conditional (docs/design.md §6): late
completions are reported, and fail the check only when `strict_sf` is asked for.

TTFT (an entitled request of a contract with a TTFT gets its first token by `T`, design §19)
is judged where the guard has its part: an entitled request must start by `T − s_max(1, p)`
(its first token's ceiling after the start). A later start is a violation while the log is
inside §19's region — reserved slots, `⌈B/r⌉·s_max + s_max(1) ≤ ttft`, `ρ_r ≤ 1`, no service
above its ceiling so far (finished, or running past it), and the floor's backlog within
`B` — and conditional outside it. A first token late after an in-time start is the
backend's (its first token slower than its ceiling): conditional, reported.

`check_fleet` checks the logs of replicas that share one floor (a Redis store): each log
on its own for everything but AF, and AF across all of them, per tenant and window as the
shared store reported it (its clock, not the replicas'): no window grants more than `B`,
and no request was refused from the floor while the fleet's grants left room for it. AF is
conditional on the store, as SF is on capacity: where a replica decided on its local
fallback (its log marks the degraded period with `store` events), that window's findings
are reported as conditional, not as violations.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from floorguard.analysis.fleet_checks import fleet_af, fleet_order, fleet_slots
from floorguard.analysis.report import (
    CheckReport,
    Floors,
    Violation,
    floors_of,
)
from floorguard.core.contract import (
    CapacityAction,
    Contract,
    ContractClass,
    DispatchOrder,
    GuardConfig,
    MeterKind,
    reload_refusals,
)
from floorguard.core.events import (
    TERMINAL_KINDS,
    EventKind,
    TraceEvent,
    config_from_dict,
    first_token_due,
    to_json,
)
from floorguard.core.monitors import first_token_report
from floorguard.core.refusals import REFUSALS, AfJudgement
from floorguard.core.request import RequestId
from floorguard.errors import TraceError

__all__ = [
    "CheckReport",
    "Violation",
    "check_fleet",
    "check_trace",
    "format_prefix",
]

_NOT_PER_REQUEST = frozenset(
    {
        EventKind.PROPOSE,
        EventKind.ENQUEUE,
        EventKind.CONFIG,
        EventKind.STORE,
        EventKind.LEASE,
    }
)


@dataclass(slots=True)
class _Open:
    tenant: str | None
    cls: ContractClass | None
    arrival_at: float
    deadline_at: float
    num_output_tokens: int
    num_prompt_tokens: int
    prompt_tokens_lower: int
    expected_entitled: bool | None = None
    entitled: bool = False
    left_queue: bool = False
    ended: bool = False
    backend: int | None = None
    kv: int = 0
    """Its KV reservation while in flight (under a budget)."""
    first_by: float = math.inf
    """Its first token's deadline `T` (∞: its contract has no TTFT)."""
    dispatched_at: float | None = None
    """Its first start."""
    first_judged: bool = False
    """A late first token of it was reported already."""
    first_seen: bool = False
    """Its first token was logged (a streamed answer)."""


class _Checker:
    def __init__(
        self, config: GuardConfig, report: CheckReport, *, shared_floor: bool = False
    ) -> None:
        self.config = config
        self.report = report
        self.shared_floor = shared_floor
        """AF is judged across the fleet's logs (`check_fleet`), not per log."""
        self.floors = Floors([(-math.inf, floors_of(config))])
        self.used: dict[tuple[str, int], int] = {}
        self.granted: Counter[tuple[str, int]] = Counter()
        self.requests: dict[RequestId, _Open] = {}
        self.waiting_entitled: set[RequestId] = set()
        self.fifo: list[RequestId] = []
        self.fifo_head = 0
        self.in_flight = [0] * len(config.slots)
        self.kv_in_flight = [0] * len(config.slots)
        self.index = 0
        self.ttft_contracts = _ttft_contracts(config)
        self.num_above_ceiling = 0
        """Services above their ceiling `s_max(ℓ, p)` so far (§6's A3 broken)."""
        self.max_waiting_entitled = 0
        self.max_assured_tokens = 0
        self.max_assured_prompt = 0
        self.running: set[RequestId] = set()
        """The requests in flight (dispatched, not ended)."""

    def violate(self, prop: str, request_id: RequestId | None, message: str) -> None:
        self.report.violations.append(Violation(prop, self.index, request_id, message))

    def reload(self, event: TraceEvent, config: GuardConfig) -> None:
        """A reload's `config` event: slots and queue limits at once, floors from its
        window, which must not be open yet; what cannot change in a reload must not."""
        window = event.window
        assert window is not None
        open_window = math.floor(
            (event.at - self.config.schedule.origin_at) / self.config.schedule.window_s
        )
        if window <= open_window:
            self.violate(
                "AF",
                None,
                f"a reload at t = {event.at:.3f} gives window {window} new floors, but window "
                f"{open_window} is already open",
            )
        refusals = reload_refusals(self.config, config)
        if refusals:
            raise TraceError(
                f"event {self.index}: a reload changed what only a restart may: "
                + "; ".join(refusals)
            )
        while self.floors.changes[-1][0] >= window:  # a reload replacing one not yet in force
            self.floors.changes.pop()
        self.floors.changes.append((window, floors_of(config)))
        self.in_flight += [0] * (len(config.slots) - len(self.in_flight))
        self.kv_in_flight += [0] * (len(config.slots) - len(self.kv_in_flight))
        self.config = config
        self.ttft_contracts = _ttft_contracts(config)

    def on_event(self, event: TraceEvent) -> None:
        kind, rid = event.kind, event.request_id
        if kind is EventKind.ARRIVE:
            self._arrive(event)
            return
        if kind in _NOT_PER_REQUEST:
            return
        state = self.requests.get(rid)  # type: ignore[arg-type]
        if state is None:
            self.violate("TERMINAL", rid, f"{kind.value} for a request that never arrived")
            return
        if state.ended:
            self.violate("TERMINAL", rid, f"{kind.value} after the request already ended")
            return
        handler = getattr(self, f"_on_{kind.value}", None)
        if handler is not None:
            handler(event, state)
        if kind in TERMINAL_KINDS:
            state.ended = True
            self.report.counts[kind.value] += 1

    def _arrive(self, event: TraceEvent) -> None:
        rid = event.request_id
        if rid in self.requests:
            self.violate("TERMINAL", rid, "arrived twice")
            return
        self.report.num_requests += 1
        state = _Open(
            event.tenant,
            event.cls,
            event.at,
            event.deadline_at if event.deadline_at is not None else math.inf,
            event.num_output_tokens or 0,
            event.num_prompt_tokens or 0,
            event.min_prompt_tokens
            if event.min_prompt_tokens is not None
            else (event.num_prompt_tokens or 0),
        )
        self.requests[rid] = state  # type: ignore[index]
        contract = self.ttft_contracts.get(event.tenant or "")
        if contract is not None:
            state.first_by = first_token_due(event, contract)
        if event.cls is ContractClass.ASSURED:
            self.max_assured_tokens = max(self.max_assured_tokens, state.num_output_tokens)
            self.max_assured_prompt = max(self.max_assured_prompt, state.num_prompt_tokens)
        config = self.config
        if self.shared_floor or not config.kv_fits_somewhere(
            config.kv_reservation(state.num_prompt_tokens, state.num_output_tokens)
        ):
            return  # (one no KV cache can hold is refused before the floor: docs/design.md §16)
        schedule = self.config.schedule
        window = math.floor((event.at - schedule.origin_at) / schedule.window_s)
        floor = self.floors.at(window).get(event.tenant or "")
        if floor is None:
            return
        weight = (
            state.num_prompt_tokens + state.num_output_tokens
            if self.config.meter is MeterKind.TOKEN
            else 1
        )
        key = (event.tenant or "", window)
        state.expected_entitled = self.used.get(key, 0) + weight <= floor
        if state.expected_entitled:
            self.used[key] = self.used.get(key, 0) + weight
            self.report.num_entitled += 1

    def _decided(self, state: _Open, rid: RequestId | None, entitled: bool, what: str) -> None:
        if state.expected_entitled and not entitled:
            self.violate("AF", rid, f"floor-entitled assured request was {what}")
        if entitled and state.expected_entitled is False:
            self.violate("AF", rid, "admitted from the floor beyond B in its window")
        state.expected_entitled = None  # decided once

    def _on_admit(self, event: TraceEvent, state: _Open) -> None:
        state.entitled = bool(event.entitled)
        if self.shared_floor and state.entitled:
            self.report.num_entitled += 1
        if state.expected_entitled is not None:
            self._decided(state, event.request_id, state.entitled, "admitted as surplus")
        if state.entitled:
            self.waiting_entitled.add(event.request_id)  # type: ignore[arg-type]
            self.max_waiting_entitled = max(self.max_waiting_entitled, len(self.waiting_entitled))
        self.fifo.append(event.request_id)  # type: ignore[arg-type]

    def _on_demote(self, event: TraceEvent, state: _Open) -> None:
        if state.expected_entitled is not None:
            self._decided(state, event.request_id, False, "demoted")

    def _on_reject(self, event: TraceEvent, state: _Open) -> None:
        """A refused floor-entitled request is judged by its reason's row of the refusal
        table (`core/refusals.py`); a reason not in it is an AF violation."""
        row = REFUSALS.get(event.reason or "")  # type: ignore[call-overload]
        if (
            state.expected_entitled
            and row is not None
            and row.af is AfJudgement.LOWERED_FLOOR
            and self.config.capacity_action is CapacityAction.LOWER_FLOOR
        ):
            # the floor lowered under measured capacity loss: still counted against B
            state.expected_entitled = None
        if state.expected_entitled is not None:
            self._decided(state, event.request_id, False, f"rejected ({event.reason})")

    def _leave_queue(self, event: TraceEvent, state: _Open, *, started: bool = True) -> None:
        """ORDER judges starts; a doomed request may be dropped whenever it is doomed (the
        guard's doom timer), whatever waits beside it."""
        rid = event.request_id
        dispatch = self.config.dispatch
        if (
            started
            and dispatch is DispatchOrder.ASSURED_FIRST
            and not state.entitled
            and self.waiting_entitled
        ):
            self.violate(
                "ORDER",
                rid,
                f"surplus request left the queue while "
                f"{len(self.waiting_entitled)} floor-entitled waited",
            )
        self.waiting_entitled.discard(rid)
        if dispatch is DispatchOrder.FIFO and started:
            self._skip_left()
            if self.fifo_head < len(self.fifo) and self.fifo[self.fifo_head] != rid:
                self.violate("ORDER", rid, "FIFO dispatch out of admission order")
        state.left_queue = True

    def _skip_left(self) -> None:
        fifo, requests = self.fifo, self.requests
        while self.fifo_head < len(fifo) and requests[fifo[self.fifo_head]].left_queue:
            self.fifo_head += 1

    def _on_dispatch(self, event: TraceEvent, state: _Open) -> None:
        self._leave_queue(event, state)
        if state.dispatched_at is None:
            state.dispatched_at = event.at
            if state.entitled and state.first_by < math.inf:
                self._judge_start(event, state)
        backend = event.backend if event.backend is not None else 0
        if not 0 <= backend < len(self.in_flight):
            self.violate("SLOTS", event.request_id, f"dispatched to unknown backend {backend}")
            return
        state.backend = backend
        self.running.add(event.request_id)  # type: ignore[arg-type]
        self.in_flight[backend] += 1
        if self.in_flight[backend] > self.config.slots[backend]:
            self.violate(
                "SLOTS",
                event.request_id,
                f"backend {backend} has {self.in_flight[backend]} in flight > C = "
                f"{self.config.slots[backend]}",
            )
        config = self.config
        if config.kv_budgeted:
            state.kv = config.kv_reservation(state.num_prompt_tokens, state.num_output_tokens)
            self.kv_in_flight[backend] += state.kv
            held, room = self.kv_in_flight[backend], config.kv_tokens[backend]
            if room is not None and held > room:
                self.violate(
                    "MEMORY",
                    event.request_id,
                    f"backend {backend} holds {held} reserved KV tokens > its {room}",
                )

    def _judge_start(self, event: TraceEvent, state: _Open) -> None:
        """TTFT, the guard's part: an entitled request starts by `T − s_max(1, p)`."""
        upper = self.config.upper_envelope
        ceiling = upper.at(1, state.num_prompt_tokens) if upper is not None else 0.0
        late_s = event.at - (state.first_by - ceiling)
        if late_s <= 0:
            return
        state.first_judged = True
        self.report.num_ttft_late += 1
        region = first_token_report(
            self.config,
            num_output_tokens=max(self.max_assured_tokens, 1),
            num_prompt_tokens=self.max_assured_prompt,
            num_above_ceiling=self.num_above_ceiling + self._running_past_ceiling(event.at),
            max_backlog=self.max_waiting_entitled,
        )
        message = (
            f"floor-entitled request started {late_s * 1e3:.1f} ms after T − s_max(1, p), "
            "too late for its first token by its TTFT"
        )
        if region is not None and region.inside:
            self.violate("TTFT", event.request_id, message + " inside design §19's region")
        else:
            why = "; ".join(region.reasons) if region is not None else "no TTFT contract"
            self.conditional("TTFT", event.request_id, f"{message} (outside the region: {why})")

    def _running_past_ceiling(self, now: float) -> int:
        """Requests in flight at `now` already running longer than their ceiling."""
        upper = self.config.upper_envelope
        if upper is None:
            return 0
        running = (self.requests[rid] for rid in self.running)
        return sum(
            1
            for s in running
            if s.dispatched_at is not None
            and now - s.dispatched_at > upper.at(s.num_output_tokens, s.num_prompt_tokens)
        )

    def conditional(self, prop: str, request_id: RequestId | None, message: str) -> None:
        self.report.conditional.append(Violation(prop, self.index, request_id, message))

    def _on_first_token(self, event: TraceEvent, state: _Open) -> None:
        state.first_seen = True
        self._first_token(event, state, "first token")

    def _first_token(self, event: TraceEvent, state: _Open, what: str) -> None:
        """A first token after `T` from a start in time: the backend's, conditional."""
        if not state.entitled or state.first_judged or event.at <= state.first_by:
            return
        state.first_judged = True
        self.report.num_ttft_late += 1
        self.conditional(
            "TTFT",
            event.request_id,
            f"floor-entitled request's {what} came {(event.at - state.first_by) * 1e3:.1f} ms "
            "after its TTFT, from a start in time: the backend's first token took longer than "
            "its ceiling s_max(1, p)",
        )

    def _on_drop(self, event: TraceEvent, state: _Open) -> None:
        self._leave_queue(event, state, started=False)
        self.report.num_drops += 1
        lower = self.config.lower_envelope
        if lower is None:
            self.violate("DR", event.request_id, "dropped, but the config has no lower envelope")
            return
        if event.at + lower.at(*self._sizes(state)) > state.deadline_at:
            return
        first = lower.at(0, state.prompt_tokens_lower)
        if lower.per_token_s > 0 and event.at + first > state.first_by:
            return  # its first token was doomed (design §19)
        slack = state.deadline_at - event.at - lower.at(*self._sizes(state))
        self.violate(
            "DR",
            event.request_id,
            f"dropped with t + L(ℓ) ≤ D (slack {slack * 1e3:.1f} ms): not doomed",
        )

    @staticmethod
    def _sizes(state: _Open) -> tuple[int, int]:
        """(ℓ, the prompt tokens `L` may count: the lower bound where the count was one)."""
        return state.num_output_tokens, state.prompt_tokens_lower

    def _on_requeue(self, event: TraceEvent, state: _Open) -> None:
        """Its backend was unreachable: the slot is free and the request waits again, in
        its old place (the front of its queue)."""
        self._free(event, state)
        state.left_queue = False
        if state.entitled:
            self.waiting_entitled.add(event.request_id)  # type: ignore[arg-type]
        if self.config.dispatch is DispatchOrder.FIFO:
            self._skip_left()
            self.fifo.insert(self.fifo_head, event.request_id)  # type: ignore[arg-type]

    def _free(self, event: TraceEvent, state: _Open) -> None:
        self.running.discard(event.request_id)
        if state.backend is not None:
            self.in_flight[state.backend] -= 1
            self.kv_in_flight[state.backend] -= state.kv
            state.backend, state.kv = None, 0

    def _on_complete(self, event: TraceEvent, state: _Open) -> None:
        upper = self.config.upper_envelope
        if state.backend is not None and state.dispatched_at is not None and upper is not None:
            ceiling = upper.at(state.num_output_tokens, state.num_prompt_tokens)
            self.num_above_ceiling += event.at - state.dispatched_at > ceiling
        if not state.first_seen:
            self._first_token(event, state, "answer (not streamed: its first byte)")
        self._free(event, state)
        if state.entitled and event.at > state.deadline_at:
            self.report.num_sf_late += 1
            self.violate(
                "SF",
                event.request_id,
                f"floor-entitled request completed "
                f"{(event.at - state.deadline_at) * 1e3:.1f} ms after its deadline",
            )

    def _on_fail(self, event: TraceEvent, state: _Open) -> None:
        self._free(event, state)

    def _on_abort(self, event: TraceEvent, state: _Open) -> None:
        self._free(event, state)
        state.left_queue = True
        self.waiting_entitled.discard(event.request_id)


def check_trace(events: Iterable[TraceEvent], *, allow_open: bool = False) -> CheckReport:
    """Check a whole log. `allow_open` accepts requests still open at the end (a live log)."""
    report = CheckReport()
    _check_one(events, report, allow_open=allow_open, shared_floor=False)
    return report


def check_fleet(logs: Sequence[Sequence[TraceEvent]], *, allow_open: bool = False) -> CheckReport:
    """Check the logs of replicas sharing one floor; each violation names its log
    (`Violation.log`, the position in `logs`). Logs of several pools are checked pool by
    pool (each pool is a fleet of its own)."""
    pools = {e.pool for events in logs for e in events}
    if pools == {None}:
        return _check_fleet_pool(logs, allow_open)
    report = CheckReport()
    for pool in sorted(pools, key=str):
        positions = [[i for i, e in enumerate(events) if e.pool == pool] for events in logs]
        part = _check_fleet_pool(
            [[events[i] for i in at] for events, at in zip(logs, positions, strict=True)],
            allow_open,
        )
        for name in (
            "num_events",
            "num_requests",
            "num_entitled",
            "num_drops",
            "num_sf_late",
            "num_ttft_late",
        ):
            setattr(report, name, getattr(report, name) + getattr(part, name))
        for found, into in (
            (part.violations, report.violations),
            (part.conditional, report.conditional),
        ):
            into.extend(
                replace(
                    v,
                    index=positions[v.log][v.index]
                    if v.index < len(positions[v.log])
                    else len(logs[v.log]),
                )
                for v in found
            )
        report.degraded_s = [
            a + b
            for a, b in zip(
                report.degraded_s or [0.0] * len(logs),
                part.degraded_s or [0.0] * len(logs),
                strict=True,
            )
        ]
        report.fleet_peak_in_flight |= part.fleet_peak_in_flight
        report.counts.update(part.counts)
    return report


def _check_fleet_pool(logs: Sequence[Sequence[TraceEvent]], allow_open: bool) -> CheckReport:
    report = CheckReport()
    checkers = []
    for number, events in enumerate(logs):
        start = len(report.violations)
        checkers.append(_check_one(events, report, allow_open=allow_open, shared_floor=True))
        report.violations[start:] = [replace(v, log=number) for v in report.violations[start:]]
    configs = [c.config for c in checkers]
    floors = [c.floors for c in checkers]
    if not any(f.reloaded for f in floors) and any(
        f.changes[0][1] != floors[0].changes[0][1] for f in floors
    ):
        raise TraceError("the logs' configs give different floors: not one fleet")
    if configs:
        fleet_af(logs, configs[0], floors, report)
        fleet_slots(logs, configs, report)
        if any(c.slot_leases for c in configs):
            fleet_order(logs, configs, report)
    return report


def _ttft_contracts(config: GuardConfig) -> dict[str, Contract]:
    """Tenant → its contract, for the contracts with a TTFT."""
    return {c.tenant: c for c in config.contracts if c.ttft_budget_s is not None}


def _check_one(
    events: Iterable[TraceEvent], report: CheckReport, *, allow_open: bool, shared_floor: bool
) -> _Checker:
    """Check one log; a log of several pools (`models:`, events tagged with `pool`) is
    checked per pool, each against its own config events (a reload's names the window its
    floors govern from). Returns the (first pool's) checker."""
    checkers: dict[str | None, _Checker] = {}
    index = -1
    for index, event in enumerate(events):
        report.num_events += 1
        if event.kind is EventKind.CONFIG:
            _on_config(event, index, checkers, report, shared_floor)
            continue
        checker = checkers.get(event.pool)
        if checker is None:
            if not checkers:
                raise TraceError(
                    "the trace must start with a config event (a rotated segment after the "
                    "first? `floorguard verify LOG --rotated` reads them all as one log)"
                )
            raise TraceError(f"event {index} of pool {event.pool!r} before its config event")
        checker.index = index
        checker.on_event(event)
    if not checkers:
        raise TraceError("the trace has no config event")
    if not allow_open:
        for checker in checkers.values():
            checker.index = index + 1
            for rid, state in checker.requests.items():
                if not state.ended:
                    checker.violate("TERMINAL", rid, "no terminal outcome by the end of the log")
    return next(iter(checkers.values()))


def _on_config(
    event: TraceEvent,
    index: int,
    checkers: dict[str | None, _Checker],
    report: CheckReport,
    shared_floor: bool,
) -> None:
    """A `config` event: a reload (it names the window it governs from), else the log's
    first life or a new one (the replica died and restarted: what it held is counted)."""
    if event.data is None:
        raise TraceError("config event without a configuration")
    config = config_from_dict(event.data)
    known = checkers.get(event.pool)
    if known is not None and event.window is not None:
        known.index = index
        known.reload(event, config)
        return
    if known is not None:
        report.num_died_open += sum(not s.ended for s in known.requests.values())
    checkers[event.pool] = _Checker(config, report, shared_floor=shared_floor)


def format_prefix(events: Sequence[TraceEvent], violation: Violation, context: int = 8) -> str:
    """The tail of the shortest bad prefix, ending at the violating event."""
    start = max(0, violation.index - context + 1)
    lines = [
        f"  {i:>7}  {to_json(e)}"
        for i, e in enumerate(events[start : violation.index + 1], start=start)
    ]
    head = (
        f"first violation: {violation.prop} at event {violation.index} "
        f"(request {violation.request_id!r}): {violation.message}"
    )
    return "\n".join([head, f"bad prefix: events 0..{violation.index}; its last lines:", *lines])
