"""Contracts, the window schedule and the guard's configuration (docs/design.md §3).

All of these are frozen and validated on construction: a bad value raises `ConfigError`
naming the field, the value and the allowed range.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from floorguard.errors import require
from floorguard.windows import WindowSchedule

__all__ = [
    "AffineEnvelope",
    "CapacityAction",
    "Contract",
    "ContractClass",
    "DispatchOrder",
    "ExcessPolicy",
    "GuardConfig",
    "MeterKind",
    "QueueLimits",
    "SurplusOrder",
    "WindowSchedule",
    "reload_refusals",
    "repeated",
]


class ContractClass(StrEnum):
    ASSURED = "assured"
    """Has a reserved floor of `B` credits per window ("A95" in reports)."""
    OPPORTUNISTIC = "opportunistic"
    """Served from the surplus only, as the learner proposes ("A10" in reports)."""

    @property
    def backend_priority(self) -> int:
        """vLLM's request `priority` for this class (lower is scheduled first): assured 0,
        opportunistic 1. The one class → priority map (the guard's `forward_priority`, the
        server-priority baseline, the real-backend runs)."""
        return 0 if self is ContractClass.ASSURED else 1


class ExcessPolicy(StrEnum):
    """What happens to an assured request that arrives after its window's floor is spent."""

    REJECT = "reject"
    """Refuse it with reason `floor_exhausted` (protects the floor at tight deadlines)."""
    DEMOTE = "demote"
    """Admit it as surplus at opportunistic priority, with no SF promise."""
    SPARE = "spare"
    """Admit it as surplus (as `demote`) only into spare capacity — a slot free and no
    request queued, so it starts at once and never waits ahead of anything — else refuse
    it as `reject` does. The floor is a minimum on an idle backend, and a busy one keeps
    the floor where `reject` keeps it (docs/design.md §4.1)."""


class MeterKind(StrEnum):
    COUNT = "count"
    """Every request weighs 1 credit."""
    TOKEN = "token"
    """A request weighs its prompt tokens plus its output cap (`max_tokens`)."""


class DispatchOrder(StrEnum):
    ASSURED_FIRST = "assured-first"
    """Oldest floor-entitled request first; the surplus only when none waits (design §4.2)."""
    FIFO = "fifo"
    """One queue in arrival order: the fault-injection baseline."""


class SurplusOrder(StrEnum):
    """How the surplus (what is not floor-entitled) is ordered below the floor (design §15)."""

    FAIR = "fair"
    """Fair across the tenants competing for it: a virtual-time fair queue charging each
    request the slot time it holds (the service envelope `s_max(ℓ, p)`: decode tokens at
    the per-token cost, plus prefill); within a tenant, the learner's order (arrival order
    without hints)."""
    FAIR_TOKENS = "fair-tokens"
    """The same fair queue charging metered tokens (prompt + output cap) instead: a prompt
    token weighs as much as an output token, though a slot's time is mostly decode. The
    earlier charge, kept as the comparison (E20)."""
    LEARNER = "learner"
    """One order for all: the learner's relabel and hint, then arrival (the published
    guard's)."""


class CapacityAction(StrEnum):
    """What the guard does when its capacity estimate says `μ̂·W < B` (docs/design.md §4.4)."""

    ALARM = "alarm"
    """Count an alarm; the floor stays `B`."""
    LOWER_FLOOR = "lower-floor"
    """Also lower the effective floor to what capacity can serve, `⌊μ̂·W⌋` in all (split in
    proportion to each contract's `B`): refuse (`floor_lowered`) rather than admit work that
    would be late. AF then holds against the lowered floor, which the trace says."""


@dataclass(frozen=True, slots=True)
class AffineEnvelope:
    """A service-time bound `base_s + per_token_s · ℓ + per_prompt_token_s · p` for ℓ
    output tokens and `p` prompt tokens (the prefill term: design §12, the edge counts `p`)."""

    base_s: float
    per_token_s: float
    per_prompt_token_s: float = 0.0

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.base_s) and self.base_s >= 0, "base_s", self.base_s, "must be ≥ 0"
        )
        require(
            math.isfinite(self.per_token_s) and self.per_token_s >= 0,
            "per_token_s",
            self.per_token_s,
            "must be ≥ 0",
        )
        require(
            math.isfinite(self.per_prompt_token_s) and self.per_prompt_token_s >= 0,
            "per_prompt_token_s",
            self.per_prompt_token_s,
            "must be ≥ 0",
        )

    def at(self, num_output_tokens: int, num_prompt_tokens: int = 0) -> float:
        return (
            self.base_s
            + self.per_token_s * num_output_tokens
            + self.per_prompt_token_s * num_prompt_tokens
        )

    def max_output_tokens(self, budget_s: float, num_prompt_tokens: int = 0) -> int:
        """The largest ℓ with `at(ℓ, p) ≤ budget_s` (0 when not even one token fits)."""
        room = budget_s - self.base_s - self.per_prompt_token_s * num_prompt_tokens
        if room < self.per_token_s:
            return 0
        if self.per_token_s == 0:
            return 2**31 - 1
        return int(room / self.per_token_s)


@dataclass(frozen=True, slots=True)
class Contract:
    """One tenant's contract. The tenant name is the authenticated identity (docs/design.md §2)."""

    tenant: str
    cls: ContractClass
    deadline_budget_s: float | None
    """`d`: a request arriving at `t` is due at `D = t + d`. None: the contract states its
    SLO in first-token terms only, and `D` follows from them (`deadline_for`)."""
    floor: int = 0
    """`B`: credits reserved per window (assured only; 0 for opportunistic)."""
    excess_policy: ExcessPolicy = ExcessPolicy.REJECT
    """What happens to assured arrivals beyond the floor (docs/design.md §4.1)."""
    ttft_budget_s: float | None = None
    """Time to first token: a request arriving at `t` has its first token due by `t + ttft`
    (docs/design.md §19). None: no first-token deadline."""
    tpot_budget_s: float | None = None
    """Time per output token after the first: kept by the batch width the guard dispatches
    onto a backend (docs/design.md §19). None: none."""

    def __post_init__(self) -> None:
        require(bool(self.tenant), "tenant", self.tenant, "must be a non-empty string")
        require(
            isinstance(self.cls, ContractClass),
            "cls",
            self.cls,
            f"must be one of {[c.value for c in ContractClass]}",
        )
        for name in ("deadline_budget_s", "ttft_budget_s", "tpot_budget_s"):
            value = getattr(self, name)
            require(
                value is None or (math.isfinite(value) and value > 0),
                name,
                value,
                "must be a finite number of seconds > 0 (or absent)",
            )
        require(
            self.deadline_budget_s is not None
            or (self.ttft_budget_s is not None and self.tpot_budget_s is not None),
            "deadline_budget_s",
            self.deadline_budget_s,
            "a contract needs an end-to-end deadline, or both a TTFT and a TPOT budget (its "
            "deadline is then ttft + tpot·ℓ)",
        )
        if self.deadline_budget_s is not None and self.ttft_budget_s is not None:
            require(
                self.ttft_budget_s <= self.deadline_budget_s,
                "ttft_budget_s",
                self.ttft_budget_s,
                f"must be ≤ the deadline budget ({self.deadline_budget_s} s): the first token "
                "comes before the last",
            )
        if self.cls is ContractClass.ASSURED:
            require(
                isinstance(self.floor, int) and self.floor >= 1,
                "floor",
                self.floor,
                "an assured contract needs an integer floor B ≥ 1",
            )
        else:
            require(
                self.floor == 0, "floor", self.floor, "an opportunistic contract has no floor (0)"
            )

    @property
    def assured(self) -> bool:
        return self.cls is ContractClass.ASSURED

    def deadline_for(self, num_output_tokens: int) -> float:
        """The end-to-end budget of a request of ℓ output tokens: `d`, or without one
        `ttft + tpot·ℓ` — a request whose first token is on time and each later token within
        TPOT ends by then, so a request that cannot end by it misses its SLO."""
        if self.deadline_budget_s is not None:
            return self.deadline_budget_s
        assert self.ttft_budget_s is not None and self.tpot_budget_s is not None
        return self.ttft_budget_s + self.tpot_budget_s * num_output_tokens


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How many *surplus* requests may wait in the guard's queue (design §12): a request over
    a limit is refused `queue_full`. Floor-entitled requests are never refused by a queue
    limit (that would break AF); their queue is bounded by the floor itself — at most `B`
    per window are admitted — and the doom timers (a queued request leaves the moment it is
    doomed). None: no limit."""

    assured: int | None = None
    """Demoted burst-excess of assured tenants (`excess_policy: demote`)."""
    opportunistic: int | None = None
    per_tenant: int | None = None
    """Any one tenant's surplus requests waiting, whatever its class."""
    refuse_busy: bool = False
    """Refuse a surplus arrival at once (`busy`) when the doom gate's envelope shows it
    cannot start before it is doomed (`Guard.cannot_start_in_time`), instead of queueing it
    to be dropped at the end of its wait. Off in the published wiring; needs the gate."""

    def __post_init__(self) -> None:
        for name in ("assured", "opportunistic", "per_tenant"):
            value = getattr(self, name)
            require(
                value is None or (isinstance(value, int) and value >= 0),
                f"queue_limits.{name}",
                value,
                "must be an integer ≥ 0, or None for no limit",
            )

    def for_class(self, cls: ContractClass) -> int | None:
        return self.assured if cls is ContractClass.ASSURED else self.opportunistic


def repeated(names: Iterable[str]) -> list[str]:
    """The names given more than once, sorted (one pass: a config of 100,000 tenants is
    checked in linear time)."""
    return sorted(name for name, n in Counter(names).items() if n > 1)


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Everything the guard core needs to decide; validated as a whole on construction."""

    contracts: tuple[Contract, ...]
    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    slots: tuple[int, ...] = (4,)
    """`C` per backend (vLLM's `max_num_seqs`); the guard never has more in flight."""
    dispatch: DispatchOrder = DispatchOrder.ASSURED_FIRST
    surplus: SurplusOrder = SurplusOrder.FAIR
    """The surplus's order below the floor (assured-first dispatch only)."""
    meter: MeterKind = MeterKind.COUNT
    lower_envelope: AffineEnvelope | None = None
    """`L(ℓ)` for the doom gate; no gate when absent (DR is optional, docs/design.md §4.3)."""
    upper_envelope: AffineEnvelope | None = None
    """`s_max(ℓ)` (the service ceiling) for the monitors and the §6 report."""
    capacity_action: CapacityAction = CapacityAction.ALARM
    queue_limits: QueueLimits = field(default_factory=QueueLimits)
    backend_ids: tuple[str, ...] = ()
    """Each backend's identity (its URL) across a fleet's logs; empty: by position."""
    backend_capacity: tuple[int | None, ...] = ()
    """Each backend's own slot count, shared by every replica in front of it (docs/design.md §13):
    this replica's `slots` are its partition of it. Recorded so the fleet checker can count
    SLOTS per backend across replicas; the guard itself dispatches within `slots`."""
    slot_leases: bool = False
    """The replicas lease slots fleet-wide (design §13): `slots` is each backend's whole `C`,
    a request starts only with a lease, and the fleet checker also checks ORDER across
    replicas."""
    kv_tokens: tuple[int | None, ...] = ()
    """Each backend's KV cache in tokens (design §16; None or empty: not budgeted). A backend
    takes a request only while the reservations of what it runs — each its metered prompt
    bound + output cap, in whole blocks — fit, so vLLM never has to preempt one."""
    kv_block_tokens: int = 16
    """The KV cache's block size in tokens (vLLM's `block_size`): reservations are whole
    blocks."""
    reserved_slots: int = 0
    """`r`: slots kept for the floor's first tokens (docs/design.md §19). A request that is
    not floor-entitled starts only while the surplus holds fewer than `C − r` slots (`C`
    here: all backends'), or on a reserved slot that the floor no longer needs in this
    window and that its service ceiling gives back by the window's end. 0: none. At most
    `C − 1` is kept (`kept_slots`): a fleet's shares can shrink below `r`, and the
    surplus keeps a slot."""

    def __post_init__(self) -> None:
        require(len(self.contracts) > 0, "contracts", self.contracts, "needs at least one contract")
        duplicates = repeated(c.tenant for c in self.contracts)
        require(not duplicates, "contracts", duplicates, "each tenant may have only one contract")
        require(len(self.slots) > 0, "slots", self.slots, "needs at least one backend")
        for i, c in enumerate(self.slots):
            require(
                isinstance(c, int) and c >= 0,
                f"slots[{i}]",
                c,
                "must be an integer C ≥ 1 (0: a backend removed by a reload, draining)",
            )
        require(self.total_slots >= 1, "slots", self.slots, "needs at least one slot")
        for name, given in (
            ("backend_ids", self.backend_ids),
            ("backend_capacity", self.backend_capacity),
        ):
            require(
                not given or len(given) == len(self.slots),
                name,
                given,
                f"needs one entry per backend ({len(self.slots)})",
            )
        require(
            not self.kv_tokens or len(self.kv_tokens) == len(self.slots),
            "kv_tokens",
            self.kv_tokens,
            f"needs one entry per backend ({len(self.slots)})",
        )
        for i, kv in enumerate(self.kv_tokens):
            require(
                kv is None or (isinstance(kv, int) and kv >= self.kv_block_tokens),
                f"kv_tokens[{i}]",
                kv,
                f"must be None or at least one block ({self.kv_block_tokens} tokens)",
            )
        require(
            isinstance(self.kv_block_tokens, int) and self.kv_block_tokens >= 1,
            "kv_block_tokens",
            self.kv_block_tokens,
            "must be an integer ≥ 1",
        )
        require(
            isinstance(self.dispatch, DispatchOrder),
            "dispatch",
            self.dispatch,
            f"must be one of {[d.value for d in DispatchOrder]}",
        )
        require(
            isinstance(self.meter, MeterKind),
            "meter",
            self.meter,
            f"must be one of {[m.value for m in MeterKind]}",
        )
        require(
            isinstance(self.reserved_slots, int) and self.reserved_slots >= 0,
            "reserved_slots",
            self.reserved_slots,
            "must be an integer ≥ 0 (a guard keeps at most all of its slots but one: the "
            "surplus always has one)",
        )
        require(
            self.reserved_slots == 0 or self.dispatch is DispatchOrder.ASSURED_FIRST,
            "reserved_slots",
            self.reserved_slots,
            "needs assured-first dispatch (FIFO has no floor queue to keep slots for)",
        )
        require(
            self.reserved_slots == 0 or not self.slot_leases,
            "reserved_slots",
            self.reserved_slots,
            "is per guard: with fleet-wide slot leases another replica's surplus would hold "
            "the slots it keeps (partition the slots instead: docs/design.md §19)",
        )

    def contract_for(self, tenant: str) -> Contract | None:
        for contract in self.contracts:
            if contract.tenant == tenant:
                return contract
        return None

    @property
    def total_slots(self) -> int:
        return sum(self.slots)

    @property
    def kept_slots(self) -> int:
        """The reserved slots in force: `r`, at most all of the guard's slots but one."""
        return max(0, min(self.reserved_slots, self.total_slots - 1))

    @property
    def kv_budgeted(self) -> bool:
        return any(kv is not None for kv in self.kv_tokens)

    def kv_reservation(self, num_prompt_tokens: int, num_output_tokens: int) -> int:
        """The KV tokens a request may hold at its end: prompt + output, in whole blocks."""
        block = self.kv_block_tokens
        return -(-(num_prompt_tokens + num_output_tokens) // block) * block

    def kv_fits_somewhere(self, reservation: int) -> bool:
        """Whether any backend's KV cache could ever hold it (always, without a budget)."""
        return not self.kv_budgeted or any(kv is None or kv >= reservation for kv in self.kv_tokens)

    @property
    def total_floor(self) -> int:
        """Sum of the assured reservations: what capacity must hold against (design §3, §6)."""
        return sum(c.floor for c in self.contracts)


RESTART_ONLY = (
    "schedule",
    "dispatch",
    "surplus",
    "meter",
    "lower_envelope",
    "upper_envelope",
    "capacity_action",
    "slot_leases",
    "kv_block_tokens",
    "reserved_slots",
)
"""What a reload cannot change (`reload_refusals`): the windows the floors are counted in,
the queue's order, the meter, the envelopes the doom gate and the monitors use."""


def reload_refusals(old: GuardConfig, new: GuardConfig) -> list[str]:
    """Why `new` cannot replace `old` in a running guard (empty: it can). Contracts, slots
    and queue limits may change; backends only by position — `old`'s stay where they are
    (a removed one with 0 slots, draining) and new ones are appended — so a request in
    flight keeps its backend's index."""
    out = [
        f"{name} differs ({getattr(old, name)!r} → {getattr(new, name)!r}): it takes a restart"
        for name in RESTART_ONLY
        if getattr(old, name) != getattr(new, name)
    ]
    if old.kv_budgeted != new.kv_budgeted:
        out.append("a KV budget (kv_tokens) is set or lifted: it takes a restart")
    if len(new.slots) < len(old.slots) or new.backend_ids[: len(old.backend_ids)] != (
        old.backend_ids
    ):
        out.append(
            "backends must keep their positions: a removed backend stays with 0 slots and a "
            "new one is appended"
        )
    return out
