"""The guard server's configuration: one YAML file, validated by pydantic at start.

A bad file is refused before anything listens, with the key, the value and what is allowed
(`ConfigError`). Examples: `examples/guard.yaml`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    GuardConfig,
    MeterKind,
    QueueLimits,
    SurplusOrder,
    WindowSchedule,
    repeated,
)
from floorguard.errors import ConfigError
from floorguard.learners.registry import LearnerOptions, needs_latency_model
from floorguard.profiles import PROFILES, get_profile, tpot_slots
from floorguard.proxy.config.identity import IdentitySpec, JwtSpec, MtlsSpec, Strict, TlsSpec
from floorguard.proxy.config.sections import (
    AdminSpec,
    LimitsSpec,
    QueueSpec,
    RotateSpec,
    StoreSpec,
    TracingSpec,
    UpstreamSpec,
)
from floorguard.proxy.config.yamlfile import parse_yaml
from floorguard.sim.probe import latency_model_for, probe_lengths

__all__ = [
    "BackendSpec",
    "GuardServerConfig",
    "IdentitySpec",
    "JwtSpec",
    "MtlsSpec",
    "StoreSpec",
    "TlsSpec",
    "load_config",
    "server_ssl_context",
]


class ContractSpec(Strict):
    tenant: str = Field(min_length=1)
    """The tenant's name, as its identity (JWT claim, certificate, gateway header) gives it."""
    cls: ContractClass = Field(alias="class")
    """`assured`: a floor of `floor` requests per window; `opportunistic`: the surplus only."""
    deadline_ms: float | None = Field(default=None, gt=0)
    """The deadline `d` of each request, from its arrival (design §4): doom is judged against
    it. Absent: the contract gives `ttft_ms` and `tpot_ms`, and a request of ℓ output tokens
    is due at `ttft + tpot·ℓ` (docs/design.md §19)."""
    ttft_ms: float | None = Field(default=None, gt=0)
    """Time to first token, from arrival (the first streamed chunk; a non-streamed answer's
    first byte): a first token that provably cannot come by then is doomed, and an assured
    floor's is bounded with `reserved_slots` (docs/design.md §19)."""
    tpot_ms: float | None = Field(default=None, gt=0)
    """Time per output token after the first. With `ttft_ms` and no `deadline_ms`, it sets
    the request's end-to-end deadline (`ttft + tpot·ℓ`); the access log, metrics and decision
    log measure it (docs/design.md §19)."""
    floor: int = Field(default=0, ge=0)
    """`B`: requests (or tokens, with `meter: token`) reserved per window, admitted whatever
    the learner says (AF)."""
    excess_policy: ExcessPolicy = ExcessPolicy.SPARE
    """An assured tenant's requests past its floor. `spare` (the default): served as surplus
    while a slot is free and nothing is queued, else refused `floor_exhausted` — the floor
    is a minimum on an idle backend, and a busy one refuses the excess as `reject` does.
    `reject`: always refused — pick it where even excess started on a free slot must never
    hold one an entitled arrival may want (a deadline near one service). `demote`: always
    admitted as surplus, queued behind the floor — where deadlines are loose (about twice
    the service or more). E12 measures the three (docs/results.md); docs/design.md §4.1."""
    models: list[str] | None = Field(default=None, min_length=1)
    """With `models:` pools: the models this contract covers (default: every one). A floor
    is reserved in each pool it covers; a tenant has at most one contract per model."""

    def covers(self, model: str) -> bool:
        return self.models is None or model in self.models

    @model_validator(mode="after")
    def _a_deadline_or_first_token_terms(self) -> ContractSpec:
        if self.deadline_ms is None and (self.ttft_ms is None or self.tpot_ms is None):
            raise ValueError(
                "give deadline_ms, or both ttft_ms and tpot_ms (the deadline is then "
                "ttft + tpot·ℓ for ℓ output tokens)"
            )
        if self.deadline_ms is not None and (self.ttft_ms or 0) > self.deadline_ms:
            raise ValueError(
                f"ttft_ms {self.ttft_ms} > deadline_ms {self.deadline_ms}: the first token "
                "comes before the last"
            )
        return self

    def contract(self) -> Contract:
        """The core's contract (seconds)."""
        return Contract(
            self.tenant,
            self.cls,
            None if self.deadline_ms is None else self.deadline_ms / 1e3,
            self.floor,
            self.excess_policy,
            None if self.ttft_ms is None else self.ttft_ms / 1e3,
            None if self.tpot_ms is None else self.tpot_ms / 1e3,
        )

    @model_validator(mode="after")
    def _share_the_fields_set(self) -> ContractSpec:
        """One set of given field names per shape, shared by every contract that has it,
        instead of one per contract: 216 bytes a tenant, a third of what a contract's
        configuration holds at 100,000 tenants (`floorguard bench tenants --serve`). The
        model is frozen, so nothing adds to a shared set."""
        shared = _FIELD_SETS.setdefault(
            frozenset(self.__pydantic_fields_set__), self.__pydantic_fields_set__
        )
        object.__setattr__(self, "__pydantic_fields_set__", shared)
        return self


_FIELD_SETS: dict[frozenset[str], set[str]] = {}
"""`ContractSpec`'s shared sets of given field names, by their contents."""


class BackendSpec(Strict):
    url: str = Field(pattern=r"^https?://")
    """The backend's base URL (http or https)."""
    slots: int = Field(ge=1, le=4096)
    """`C` this guard may have in flight there: the whole backend's slot count for one
    guard; in a fleet with partitioned slots, the most this replica may take — its share
    is `min(slots, ⌊capacity / N⌋)` for the N replicas live, where the capacity is known
    (docs/replicas.md)."""
    capacity: int | None = Field(default=None, ge=1, le=1_000_000)
    """The backend's own slot count (vLLM's `--max-num-seqs`), shared by every replica in
    front of it: `slots` may not exceed it; checked at start against what the backend
    reports (`floorguard_backend_slots` on its /metrics, where it reports it)."""
    health_path: str = Field(default="/health", pattern=r"^/")
    """Probed for `/readyz` (vLLM and `floorguard emulate` serve `/health`)."""
    kv_tokens: int | None = Field(default=None, ge=1, le=10**9)
    """Its KV cache in tokens (vLLM: `num_gpu_blocks × block_size`, the figures its
    `cache_config_info` metric reports). Set: the guard starts a request there only while
    the reservations of what runs there (metered prompt bound + output cap, in whole
    blocks) fit, so vLLM never preempts a running request (docs/design.md §16); a request no
    backend can hold is refused, 429 `kv_excess`. None: slots only."""


class ModelSpec(Strict):
    """One model's pool: the backends that serve it (each with its own `slots`). A pool is
    guarded on its own: its queue, its slots, its contracts' floors (docs/http.md)."""

    backends: list[BackendSpec] = Field(min_length=1)


class LearnerHttpSpec(Strict):
    url: str = Field(pattern=r"^https?://")
    """POSTed one JSON summary per surplus request (wire format: proxy/pool/learner_http.py)."""
    timeout_ms: float = Field(default=50.0, gt=0, le=10_000)
    """No answer in time → the surplus request is rejected as a learner fault."""


class LearnerOptionsSpec(Strict):
    """For the built-in latency predictors (`predictor-sheddable`, `predictor-agnostic`):
    they are fitted at start on the configured `profile` and admit against `slo_ms`."""

    beta: float = Field(default=1.0, ge=0, le=100)
    """Miscalibration: predictions are scaled by β (1: as fitted; 0: everything looks fast)."""
    slo_ms: float | None = Field(default=None, gt=0)
    """The latency SLO; default: the smallest opportunistic deadline."""
    fit: Literal["published", "light-only"] = "published"
    """`published`: the published predictor, 132 probe samples from idle to saturated (the
    one `floorguard calibrate` saves with a profile, else fitted on simulated probes of the
    profile); `light-only`: 132 light-load samples alone, a learner that never sheds."""


class GuardServerConfig(Strict):
    host: str = "127.0.0.1"
    """The address the guard listens on."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Its port."""
    window_s: float = Field(default=1.0, gt=0)
    """`W`: the length of the tumbling window the floors are counted in."""
    origin_at: float = 0.0
    """`t0`: the shared epoch the windows are counted from (every replica the same)."""
    contracts: list[ContractSpec] = Field(min_length=1)
    """One contract per tenant (per model with `models:`)."""
    backends: list[BackendSpec] = Field(default_factory=list)
    """One pool of backends serving whatever model a request names; or `models`."""
    models: dict[str, ModelSpec] | None = None
    """Pools by model name: a request is guarded by the pool of its body's `model` (404
    `model_not_found` for one not listed); `/v1/models` lists these names."""
    identity: IdentitySpec
    """How each request's tenant is authenticated, before any learner runs."""
    tls: TlsSpec | None = None
    """Serve HTTPS (and, with `identity.mode: mtls`, verify client certificates)."""
    store: StoreSpec | None = None
    """Share the floor with other replicas through Redis (`store: redis://…` for short);
    none: this process's memory."""
    replica: str | None = None
    """This replica's name, prefixed to its request ids (default: host-pid)."""
    workers: int = Field(default=1, ge=1, le=64)
    """Serving processes on this host, all on `port` (SO_REUSEPORT: the kernel spreads the
    connections over them), each a replica of the fleet that shares the floor through
    `store` (docs/design.md §13), so more than one needs a store. Worker `i` is replica
    `<replica or host>-w<i>-<pid>`, writes its own decision and access logs
    (`decisions.w<i>.jsonl` beside `decisions.jsonl`) and serves `/metrics` and `/admin`
    on `admin.port + i`. `serve` supervises them: it passes SIGTERM and SIGHUP on, and
    starts a worker that dies again (docs/deploy.md, Workers)."""
    learner: str = "always-admit"
    """A registered learner, a `package.module:factory` path, or `http` (`learner_http`)."""
    learner_http: LearnerHttpSpec | None = None
    """`learner: http`: the external learner service."""
    learner_options: LearnerOptionsSpec = LearnerOptionsSpec()
    profile: str | None = "v100-moe"
    """Service envelope (L for the doom gate, s_max for the monitors); None: no doom gate."""
    strict: bool = False
    """Refuse to start outside docs/design.md §6's region (where SF is not promised), instead of
    warning."""
    doom_gate: bool = True
    """Drop provably doomed requests (`now + L > deadline`, docs/design.md §4.3) with the profile's
    `L`; false keeps the profile for `s_max` and the learner's fit, and drops nothing."""
    limits: LimitsSpec = LimitsSpec()
    queue: QueueSpec = QueueSpec()
    upstream: UpstreamSpec = UpstreamSpec()
    admin: AdminSpec = AdminSpec()
    header_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A connection that sends no complete request for this long is closed (aiohttp's
    keep-alive timer, which also covers unfinished headers)."""
    max_connections: int | None = Field(default=None, ge=16)
    """Open client connections at most; at the cap a new one evicts the oldest idle one.
    None: all the descriptor limit (raised to its hard limit at start) leaves after the
    upstream connections and a reserve; a cap that does not fit refuses to start."""
    client_write_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """A reply write the client does not take within this long cuts it (`client_too_slow`).
    The slot is not held meanwhile: the backend is read at its own pace."""
    half_close: Literal["refuse", "serve"] = "refuse"
    """A client that closes its sending side (TCP half-close) after a whole request:
    `refuse` answers 400 `half_closed` and aborts the request at once, as nginx and most
    servers treat it (a client that left and one that stopped sending look the same, and
    a queued request whose client left must not wait for a slot); `serve` answers it in
    full, and a client that left is then only found at the first failed write."""
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    """On SIGTERM: stop accepting, answer 503 `draining`, and give in-flight requests this
    long to finish before exiting."""
    health_interval_s: float = Field(default=2.0, gt=0, le=300)
    """How often each backend's `health_path` is probed; `/readyz` is 200 while at least
    one backend answered its last probe."""
    health_timeout_s: float = Field(default=2.0, gt=0, le=60)
    """A probe not answered within this long counts as failed."""
    health_failures_to_down: int = Field(default=3, ge=1, le=100)
    """Consecutive failed probes before a healthy backend stops getting requests (one slow
    answer under load is not an outage; a refused connection at dispatch marks it down at
    once, and a backend never seen healthy starts down)."""
    meter: MeterKind = MeterKind.COUNT
    """`count` (a request weighs 1 credit of `floor`) or `token` (its prompt tokens, as the
    edge counts them, plus its output cap: `floor` is then a token budget per window)."""
    dispatch: DispatchOrder = DispatchOrder.ASSURED_FIRST
    """`assured-first` (SF: floor-entitled requests start first), or `fifo` (admission order:
    the gated-FIFO baseline of the evaluation, E3)."""
    surplus: SurplusOrder = SurplusOrder.FAIR
    """Below the floor: `fair` across the tenants competing for the surplus (a virtual-time
    fair queue charging each request the slot time it holds, by `profile`'s service
    ceiling; within a tenant the learner's order), `fair-tokens` (the same queue charging
    metered tokens, a prompt token like an output token), or `learner` (one order for
    all, the learner's: a flooder can take all of it)."""
    forward_priority: bool = False
    """Add vLLM's `priority` (assured 0, opportunistic 1) to forwarded bodies."""
    decision_log: Path | None = None
    """The decision log (JSONL trace events, `floorguard verify` reads it); none: off."""
    decision_log_flush_s: float = Field(default=0.2, gt=0, le=60)
    """The decision log (and the access log) is written in batches, at least this often
    (and at shutdown)."""
    decision_log_rotate: RotateSpec | None = None
    """Rotation of the decision log, and of the access log alike."""
    access_log: str | None = None
    """One JSON line per request (request id, tenant, class, model, decision, status,
    outcome, timings): `-` for stdout, or a file; none: no access log."""
    tracing: TracingSpec | None = None
    """OpenTelemetry: a span per request, exported over OTLP/HTTP (the `otel` extra); none:
    the client's `traceparent` is only forwarded to the backend."""
    kv_block_tokens: int = Field(default=16, ge=1, le=4096)
    """The backends' KV block size in tokens (vLLM's `--block-size`): a reservation under
    `backends[].kv_tokens` is whole blocks."""
    reserved_slots: int = Field(default=0, ge=0, le=1_000_000)
    """`r`: slots this guard keeps for the assured floor's first tokens, of all its backends'
    (per pool; per worker and per replica, of its own share). A request that is not
    floor-entitled starts while the surplus holds fewer than `C − r` slots, or on a
    reserved slot the floor no longer needs in this window if its service ceiling gives the
    slot back by the window's end; so the floor's first token never waits out a long
    surplus decode. Needs `dispatch: assured-first` and partitioned slots in a fleet; the
    start-up report gives the first-token bound it buys (docs/design.md §19)."""
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The event loop `serve` runs on: `auto` is uvloop where it is installed (the `uvloop`
    extra), else asyncio's own; the start-up report says which."""
    log_format: Literal["text", "json"] = "text"
    """`serve`'s own log (stderr) and its start-up report (stdout): `text` lines, or `json`:
    one JSON object a line (`t`, `level`, `logger`, `message`), for a log collector."""

    @model_validator(mode="after")
    def _backends_or_models(self) -> GuardServerConfig:
        if (not self.backends) == (self.models is None):
            raise ValueError(
                "give `backends` (one pool, any model) or `models` (a pool per model), "
                "exactly one of them"
            )
        if self.models is None:
            for i, c in enumerate(self.contracts):
                if c.models is not None:
                    raise ValueError(f"contracts[{i}].models needs a `models:` section")
            return self
        if not self.models:
            raise ValueError("models: name at least one model and its backends")
        twice = repeated(b.url.rstrip("/") for m in self.models.values() for b in m.backends)
        if twice:
            raise ValueError(
                f"backend {twice[0]} is in two pools: its slots would be counted twice "
                "(give each model its own backends)"
            )
        for i, c in enumerate(self.contracts):
            unknown = sorted(set(c.models or ()) - set(self.models))
            if unknown:
                raise ValueError(
                    f"contracts[{i}] ({c.tenant}) names model {unknown[0]!r}, not one of "
                    f"models: {sorted(self.models)}"
                )
        for name in self.models:
            tenants = [c.tenant for c in self.contracts if c.covers(name)]
            twice = repeated(tenants)
            if twice:
                raise ValueError(
                    f"tenant {twice[0]!r} has two contracts covering model {name!r}: give "
                    "each contract the models it covers"
                )
            if not tenants:
                raise ValueError(f"model {name!r}: no contract covers it")
        return self

    def pools(self) -> dict[str | None, GuardServerConfig]:
        """One configuration per pool: `{None: self}` without `models`; else per model, its
        backends, the contracts covering it, and the store's keys under its name."""
        if self.models is None:
            return {None: self}
        return {
            name: self.model_copy(
                update={
                    "backends": spec.backends,
                    "models": None,
                    "contracts": [c for c in self.contracts if c.covers(name)],
                    "store": self.store.model_copy(update={"prefix": f"{self.store.prefix}:{name}"})
                    if self.store is not None
                    else None,
                }
            )
            for name, spec in self.models.items()
        }

    @model_validator(mode="after")
    def _uvloop_installed(self) -> GuardServerConfig:
        if self.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError(
                "event_loop: uvloop, and uvloop is not installed: pip install "
                "'floorguard[uvloop]' (or event_loop: auto)"
            )
        return self

    def loop_choice(self) -> str:
        """`uvloop` or `asyncio`: what `serve` runs on."""
        if self.event_loop == "auto":
            return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
        return self.event_loop

    @model_validator(mode="after")
    def _workers_share_a_store(self) -> GuardServerConfig:
        if self.workers == 1:
            return self
        if self.store is None:
            raise ValueError(
                f"workers: {self.workers} share the floor through a store: configure `store:` "
                "(a Redis), or run one worker — apart, each worker would grant every tenant "
                "its whole floor B"
            )
        if self.port == 0:
            raise ValueError("workers > 1 listen on one port together: give `port` (not 0)")
        if not self.admin.port:
            raise ValueError(
                "workers > 1 need `admin.port`: worker i serves /metrics and /admin on "
                "admin.port + i (on the shared port a scrape would reach any one of them)"
            )
        admin_ports = range(self.admin.port, self.admin.port + self.workers)
        if admin_ports.stop > 65536 or self.port in admin_ports:
            raise ValueError(
                f"the workers' admin ports {admin_ports.start}–{admin_ports.stop - 1} must be "
                f"ports (≤ 65535) other than `port` {self.port}"
            )
        return self

    def for_worker(self, index: int) -> GuardServerConfig:
        """Worker `index`'s own configuration under `workers: N` (see `workers`): its
        replica name, its logs, its admin port."""
        base = self.replica or socket.gethostname()
        admin = self.admin.model_copy(update={"port": (self.admin.port or 0) + index})
        access = self.access_log
        return self.model_copy(
            update={
                "replica": f"{base}-w{index}-{os.getpid()}",
                "decision_log": _per_worker(self.decision_log, index),
                "access_log": access if access in (None, "-") else str(_per_worker(access, index)),
                "admin": admin,
            }
        )

    @field_validator("store", mode="before")
    @classmethod
    def _store_url_shorthand(cls, value: object) -> object:
        return {"url": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _slots_fit_the_backend(self) -> GuardServerConfig:
        for where, backend in self.all_backends():
            if backend.capacity is not None and backend.slots > backend.capacity:
                raise ValueError(
                    f"{where} ({backend.url}): slots {backend.slots} > its capacity "
                    f"{backend.capacity}: a guard may not have more in flight than the "
                    "backend runs (docs/replicas.md)"
                )
        return self

    def all_backends(self) -> list[tuple[str, BackendSpec]]:
        """Every backend with the key that configures it (`backends[0]`,
        `models.m.backends[0]`)."""
        if self.models is None:
            return [(f"backends[{i}]", b) for i, b in enumerate(self.backends)]
        return [
            (f"models.{name}.backends[{i}]", b)
            for name, spec in self.models.items()
            for i, b in enumerate(spec.backends)
        ]

    @model_validator(mode="after")
    def _http_learner_needs_a_url(self) -> GuardServerConfig:
        if (self.learner == "http") != (self.learner_http is not None):
            raise ValueError("learner: http and a learner_http section go together")
        return self

    @model_validator(mode="after")
    def _predictors_need_a_profile(self) -> GuardServerConfig:
        if needs_latency_model(self.learner) and self.profile is None:
            raise ValueError(f"learner {self.learner} is fitted on a profile: set profile")
        return self

    def learner_config(self) -> LearnerOptions:
        """The learner's options; a predictor's latency model is the one `floorguard
        calibrate` saved with the profile file, else it is fitted on simulated probes of the
        profile here (once)."""
        if not needs_latency_model(self.learner):
            return LearnerOptions(beta=self.learner_options.beta)
        assert self.profile is not None
        tokens = self.limits.default_max_tokens
        budgets = [(c.cls, c.contract().deadline_for(tokens) * 1e3) for c in self.contracts]
        opportunistic = [ms for cls, ms in budgets if cls is ContractClass.OPPORTUNISTIC]
        slo_ms = self.learner_options.slo_ms or min(opportunistic or [ms for _, ms in budgets])
        return LearnerOptions(
            beta=self.learner_options.beta,
            slo_s=slo_ms / 1e3,
            latency_model=latency_model_for(
                self.profile,
                sum(b.slots for b in self.backends),
                self.learner_options.fit,
                probe_lengths(self.limits.default_max_tokens),  # what a request asks by default
            ),
        )

    @model_validator(mode="after")
    def _mtls_needs_a_client_ca(self) -> GuardServerConfig:
        if self.identity.mode == "mtls" and (self.tls is None or self.tls.client_ca_file is None):
            raise ValueError("identity.mode mtls needs a tls section with client_ca_file")
        return self

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str | None) -> str | None:
        if value is not None and value not in PROFILES and not value.endswith((".yaml", ".yml")):
            raise ValueError(f"must be one of {sorted(PROFILES)}, a profile .yaml, or null")
        return value

    @model_validator(mode="after")
    def _reserved_slots_fit(self) -> GuardServerConfig:
        for name, pool in self.pools().items():
            slots = pool.capped(tuple(b.slots for b in pool.backends))
            if self.reserved_slots and self.reserved_slots >= sum(slots):
                of = f"models.{name}: " if name is not None else ""
                capped = sum(b.slots for b in pool.backends) != sum(slots)
                raise ValueError(
                    f"{of}reserved_slots {self.reserved_slots} leaves the surplus no slot of "
                    f"the {sum(slots)} its backends run"
                    + (" at the width its tightest tpot_ms allows" if capped else "")
                    + " (docs/design.md §19)"
                )
        return self

    def capped(self, slots: tuple[int, ...]) -> tuple[int, ...]:
        """`slots` capped so the tightest TPOT of this pool's contracts holds at the width
        the guard dispatches (the profile's per-token ceiling; docs/design.md §19)."""
        profile = get_profile(self.profile) if self.profile else None
        return tpot_slots(profile, slots, (c.tpot_ms / 1e3 if c.tpot_ms else None
                                           for c in self.contracts))  # fmt: skip

    def guard_config(self) -> GuardConfig:
        profile = get_profile(self.profile) if self.profile else None
        return GuardConfig(
            contracts=tuple(c.contract() for c in self.contracts),
            schedule=WindowSchedule(self.window_s, self.origin_at),
            slots=self.capped(tuple(b.slots for b in self.backends)),
            backend_ids=tuple(b.url.rstrip("/") for b in self.backends),
            backend_capacity=tuple(b.capacity for b in self.backends)
            if any(b.capacity is not None for b in self.backends)
            else (),
            slot_leases=self.store is not None and self.store.slots == "leased",
            kv_tokens=tuple(b.kv_tokens for b in self.backends)
            if any(b.kv_tokens is not None for b in self.backends)
            else (),
            kv_block_tokens=self.kv_block_tokens,
            reserved_slots=self.reserved_slots,
            lower_envelope=profile.lower if profile and self.doom_gate else None,
            upper_envelope=profile.ceiling if profile else AffineEnvelope(60.0, 0.0),
            dispatch=self.dispatch,
            surplus=self.surplus,
            meter=self.meter,
            queue_limits=QueueLimits(
                assured=self.queue.max_assured_excess,
                opportunistic=self.queue.max_opportunistic,
                per_tenant=self.queue.max_per_tenant,
                refuse_busy=self.queue.refuse_busy,
            ),
        )


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config model that holds the key at `loc` (through lists and optionals)."""
    model: Any = GuardServerConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return None
        annotation = fields[part].annotation
        while get_origin(annotation) is not None:  # list[X], X | None, dict[str, X]
            args = [a for a in get_args(annotation) if a is not type(None)]
            annotation = args[-1] if args else None
        model = annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _config_error(exc: ValidationError) -> ConfigError:
    """Every error of the file at once, the one an operator should fix first leading: an
    unknown key (a typo is also why a key then looks missing) with the keys allowed there,
    a missing key without dumping its parent, else each naming key and value."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    found = list(dict.fromkeys(str(_one_error(e)) for e in errors))
    first = _one_error(errors[0])
    if len(found) == 1:
        return first
    rest = "\n  ".join(found[1:])
    return ConfigError(
        first.field, first.value, f"{first.allowed}\n  and {len(found) - 1} more:\n  {rest}"
    )


def _one_error(error: Any) -> ConfigError:
    key = ".".join(str(p) for p in error["loc"]) or "config"
    if error["type"] == "extra_forbidden":
        model = _model_at(tuple(error["loc"]))
        allowed = (
            sorted(f.alias or name for name, f in model.model_fields.items())
            if model is not None
            else []
        )
        return ConfigError(key, error.get("input"), f"unknown key; allowed here: {allowed}")
    if error["type"] == "missing":
        return ConfigError(key, None, "required, and missing")
    return ConfigError(key, error.get("input"), error["msg"])


_ENV_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, environ: Mapping[str, str], key: str) -> Any:
    """`${NAME}` (or `${NAME:-default}`) in every string value, from the environment; `$$`
    is a literal `$`. An unset variable without a default is an error naming it and the key."""
    if isinstance(value, dict):
        return {
            k: _interpolate(v, environ, f"{key}.{k}" if key else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate(v, environ, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(key or "config", value, f"the environment variable {name} is not set")

    return _ENV_REF.sub(one, value)


RELOADABLE = ("contracts", "backends", "models", "identity", "limits", "queue", "drain_timeout_s")
"""The keys a reload may change (SIGHUP, `POST /admin/reload`); any other takes a restart."""


def reload_refusals(old: GuardServerConfig, new: GuardServerConfig) -> list[str]:
    """Why `new` cannot replace the running `old` by a reload (empty: it can)."""
    before, after = old.model_dump(), new.model_dump()
    out = [
        f"`{key}` changed: it takes a restart (a reload changes {', '.join(RELOADABLE)})"
        for key in GuardServerConfig.model_fields
        if key not in RELOADABLE and before[key] != after[key]
    ]
    if set(old.pools()) != set(new.pools()):
        out.append("the models served (`models:`) changed: it takes a restart")
    leased = old.store is not None and old.store.slots == "leased"
    if leased and any(
        [b.url for b in p.backends] != [b.url for b in new.pools()[name].backends]
        for name, p in old.pools().items()
        if name in new.pools()
    ):
        out.append(
            "the backends of a fleet leasing slots (`store.slots: leased`) changed: it "
            "takes a restart of every replica"
        )
    return out


def _per_worker(path: str | Path | None, index: int) -> Path | None:
    """`decisions.jsonl` → `decisions.w<index>.jsonl`: each worker's own file beside it."""
    if path is None:
        return None
    path = Path(path)
    return path.with_name(f"{path.stem}.w{index}{path.suffix}")


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> GuardServerConfig:
    """Read and validate a YAML file; a bad one raises ConfigError naming key and value.
    String values may name environment variables: `${NAME}`, `${NAME:-default}`."""
    try:
        data = parse_yaml(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("config", str(path), f"cannot be read as YAML ({exc})") from exc
    data = _interpolate(data, os.environ if environ is None else environ, "")
    try:
        config = GuardServerConfig.model_validate(data)
        for pool in config.pools().values():
            pool.guard_config()  # the core's own validation (tenants, floors) runs too
    except ValidationError as exc:
        raise _config_error(exc) from exc
    return config


def server_ssl_context(tls: TlsSpec) -> ssl.SSLContext:
    """The listening socket's TLS context; with a client CA, client certificates are
    verified when presented (`CERT_OPTIONAL`: a missing one becomes a 401, not a silent
    handshake failure)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.load_verify_locations(cafile=tls.client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("tls", str(tls.cert_file), f"cannot be loaded ({exc})") from exc
    return context
