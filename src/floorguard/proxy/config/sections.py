"""The guard server's configuration, the sections that stand alone: the shared store, what
one request may ask for, the queue's bounds, the upstream timeouts, the admin paths and the
decision log's rotation. `GuardServerConfig` (proxy/config/guard.py) composes them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from floorguard.core.contract import ContractClass
from floorguard.proxy.config.identity import Strict
from floorguard.store.shared import Unavailable

__all__ = [
    "DEFAULT_CHAT_ROLES",
    "AdminSpec",
    "LimitsSpec",
    "QueueSpec",
    "RotateSpec",
    "StoreSpec",
    "TracingSpec",
    "UpstreamSpec",
]

DEFAULT_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""OpenAI's chat roles: what `limits.chat_roles` allows unless the operator lists others."""


class StoreSpec(Strict):
    url: str = Field(pattern=r"^(rediss?|redis\+cluster|redis\+sentinel)://")
    """The Redis every replica shares: `redis://host:port/db` (or `rediss://`), a Cluster
    `redis+cluster://host:port[,host:port…]`, or the master a Sentinel names
    `redis+sentinel://host:port[,host:port…]/service[/db]`."""
    replicas: int = Field(default=1, ge=1, le=1024)
    """N until the live fleet is heard from (a replica that starts while Redis is away);
    then the shares follow the replicas live in the store, and a live count that differs
    from one written here is a warning (docs/replicas.md)."""
    on_unavailable: Unavailable = Unavailable.FAIL_STATIC
    """While Redis cannot be reached: `fail_static` grants each replica ⌊B/N⌋ locally
    (docs/replicas.md)."""
    timeout_ms: float = Field(default=50.0, gt=0, le=10_000)
    """A Redis call (once connected) that takes longer fails; `attempts` failed calls in a
    row make Redis unavailable."""
    connect_timeout_ms: float = Field(default=250.0, gt=0, le=10_000)
    """Opening a new connection to Redis may take this long (not the call timeout)."""
    max_connections: int = Field(default=64, ge=1, le=10_000)
    """The connection pool's bound: a burst waits for a free connection (up to
    `pool_timeout_ms`) instead of opening more."""
    pool_timeout_ms: float = Field(default=250.0, gt=0, le=10_000)
    """How long a call may wait for a free pooled connection."""
    attempts: int = Field(default=3, ge=1, le=10)
    """Tries per decision while shared (10 ms, 20 ms … apart): a single slow or refused
    call is not an outage."""
    retry_s: float = Field(default=1.0, gt=0, le=300)
    """While Redis is unavailable, try it again at most this often."""
    prefix: str = Field(default="floorguard", min_length=1)
    """Prefix of every key this guard writes to the store."""
    slots: Literal["partition", "leased"] = "partition"
    """How the replicas share each backend's slots (docs/replicas.md): `partition`, each
    replica's `backends[].slots` is its share; `leased`, `slots` is the backend's whole `C`
    and every start takes a fleet-wide lease through this Redis (at most `C` in flight per
    backend across replicas, assured-first across them)."""
    membership_ttl_s: float = Field(default=3.0, ge=0.3, le=300)
    """A replica that has not announced itself for this long is no longer live (it beats
    every `membership_ttl_s / 3`; one that drains leaves at once)."""
    eviction: Literal["refuse", "warn"] = "refuse"
    """A Redis that can evict the floor's keys (a `maxmemory-policy` other than
    `noeviction` under a `maxmemory` limit: an evicted counter re-grants its window's
    floor): `refuse` to start, or `warn` and serve (docs/deploy.md, Redis). Checked at
    start and each time Redis answers again after an outage."""
    lease_ttl_s: float = Field(default=2.0, ge=0.2, le=60)
    """A lease not renewed for this long expires: a dead replica's slots come back within
    it (renewed every `lease_ttl_s / 4`)."""


class LimitsSpec(Strict):
    """What one request may ask for; the guard rewrites the body to it (docs/http.md)."""

    max_body_bytes: int = Field(default=1_000_000, ge=1024, le=100_000_000)
    """A request body larger than this is refused (413)."""
    max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    """The largest output cap `ℓ` a request may ask for."""
    default_max_tokens: int = Field(default=16, ge=1)
    """`ℓ` of a request that names none; written into the forwarded body."""
    max_prompt_tokens: int = Field(default=32768, ge=1, le=10_000_000)
    """The largest prompt (as counted: with `tokenizer`, else bounded by its UTF-8 bytes)."""
    tokenizer: Path | None = None
    """The backend model's local `tokenizer.json`: prompts are counted exactly (needs the
    `tokenizers` package: `pip install 'floorguard[tokenizer]'`); none: bounded by length."""
    chat_overhead_tokens: int = Field(default=8, ge=0, le=1024)
    """Tokens a chat template adds per message, counted on top of the message text."""
    unknown_fields: Literal["refuse", "drop", "forward"] = "refuse"
    """A body field the guard does not know: refused (400 `unknown_field`), dropped, or
    forwarded."""
    allow_fields: list[str] = Field(default_factory=list)
    """Fields forwarded as they are, whatever `unknown_fields` says (never a scheduling
    field: `priority` and the like are always the guard's)."""
    max_response_bytes: int = Field(default=16_000_000, ge=1024, le=1_000_000_000)
    """A backend reply larger than this is not relayed: a non-streamed one is a 502, a
    stream ends with an SSE error event (so no request's reply grows without bound)."""
    max_stop: int = Field(default=4, ge=0, le=100_000)
    """Stop strings one request may give (each at most `max_constraint_bytes`); 4 is
    OpenAI's limit and vLLM's own."""
    max_list_items: int = Field(default=1024, ge=0, le=10_000_000)
    """Entries of `stop_token_ids`, `allowed_token_ids` and `bad_words`."""
    max_logit_bias: int = Field(default=300, ge=0, le=10_000_000)
    """Entries of `logit_bias`."""
    max_constraint_bytes: int = Field(default=16_384, ge=0, le=100_000_000)
    """A guided-decoding schema, grammar, regex or choice list (`response_format`,
    `guided_*`, `structured_outputs`), as JSON bytes."""
    max_top_logprobs: int = Field(default=5, ge=0, le=1_000)
    """`top_logprobs` (a completion's `logprobs`): each streamed token carries that many."""
    chat_roles: list[str] = Field(
        default_factory=lambda: sorted(DEFAULT_CHAT_ROLES), min_length=1, max_length=64
    )
    """The roles a chat message may name; any other is refused (400 `invalid_role`). A
    backend renders whatever string it is given as a role, so an unbounded role is prompt
    the meter would not see; each allowed role is counted into the prompt."""
    max_buffered_reply_bytes: int = Field(default=4_000_000, ge=65_536, le=1_000_000_000)
    """A stream's bytes the backend has sent and its client not yet taken: a client further
    behind is cut (`client_too_slow`), its slot long since free (the backend is read at its
    own pace)."""
    max_held_reply_bytes: int = Field(default=256_000_000, ge=1_000_000, le=100_000_000_000)
    """All reply bytes held for clients together: past it the reply holding the most is cut
    (`reply_buffer_full`)."""

    @model_validator(mode="after")
    def _default_within_cap(self) -> LimitsSpec:
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"default_max_tokens = {self.default_max_tokens} exceeds max_tokens = "
                f"{self.max_tokens}"
            )
        return self


class QueueSpec(Strict):
    """How many surplus requests may wait in the guard (floor-entitled ones are bounded by
    the floor and never refused for it); over a limit: 429 `queue_full`."""

    max_opportunistic: int | None = Field(default=1024, ge=0)
    """Surplus requests waiting in the guard at most."""
    max_assured_excess: int | None = Field(default=1024, ge=0)
    """Demoted burst-excess (`excess_policy: demote`)."""
    max_per_tenant: int | None = Field(default=None, ge=0)
    """Requests one tenant may have waiting at most (none: no bound)."""
    refuse_busy: bool = True
    """Refuse a surplus request on arrival, 429 `busy` (a retry may help), when the doom
    gate's envelope proves it cannot start before it is doomed (docs/http.md), instead of
    queueing it to be dropped at the end of its wait. Needs `doom_gate`."""


class UpstreamSpec(Strict):
    """Timeouts towards the backends (instead of one total timeout, which would cut a long
    legitimate stream)."""

    connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    """Until the backend's TCP (and TLS) connection is up."""
    first_byte_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Until the backend's first byte: its headers and, streaming, the first chunk (a
    non-streamed completion answers only when done: this bounds its service)."""
    idle_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """Longest silence between two chunks of a reply."""
    inference_objectives: dict[ContractClass, str] | None = None
    """Behind a Gateway API Inference Extension pool (the backend URL is its gateway): the
    InferenceObjective each class is sent as (`x-gateway-inference-objective`), e.g.
    `{assured: premium, opportunistic: sheddable}`; a client's own header never passes."""


class AdminSpec(Strict):
    """`/admin/*` and `/metrics` (tenant names, credits): never open to tenants."""

    token: str | None = Field(default=None, min_length=16)
    """The bearer token the admin paths need (≥ 16 characters), or `token_env`."""
    token_env: str | None = None
    """The bearer token, or the environment variable that holds it."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """Serve them on a listener of their own (`host`:`port`) instead of the main one."""
    host: str = "127.0.0.1"
    """The admin listener's address (with `port`)."""


class RotateSpec(Strict):
    """Start a new decision-log file past a size or an age (`verify FILE --rotated` reads
    the segments as one log)."""

    max_mb: float | None = Field(default=None, gt=0, le=1_000_000)
    """Start a new file past this many MiB."""
    max_age_s: float | None = Field(default=None, ge=1)
    """Start a new file past this age."""


class TracingSpec(Strict):
    otlp_endpoint: str
    """Where spans go: an OTLP/HTTP traces endpoint, e.g. `http://collector:4318/v1/traces`."""
    service_name: str = "floorguard"
    """The spans' `service.name`."""
    sample_ratio: float = Field(default=1.0, ge=0, le=1)
    """The share of new traces sampled (a client's trace that it did not mark sampled is
    not)."""
    client_sample_ratio: float = Field(default=1.0, ge=0, le=1)
    """The ceiling on what a client's sampled flag can force: of the requests whose
    `traceparent` says sampled, at most this share is sampled (never fewer than
    `sample_ratio`), drawn at random — not from the trace id, which the client chose."""
    export_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """How long one export may take (it runs off the request path, in a batch)."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value
