"""Fuzzing what a client controls before the core runs: the request body and the
Authorization header. Whatever arrives, parsing ends in a value or the one refusal type
(a 4xx), never another exception (which would be a 500); and what it forwards can never
make the backend do more than the guard metered (docs/design.md §12)."""

from __future__ import annotations

import base64
import json
import time

import jwt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floorguard.proxy.config.guard import IdentitySpec
from floorguard.proxy.edge.identity import AuthError, create_identity
from floorguard.proxy.edge.normalize import (
    CONSTRAINTS,
    COSTLY_FIELDS,
    SCHEDULING_FIELDS,
    TOKEN_LISTS,
    BadRequestError,
    EdgeLimits,
    normalize,
)

SECRET = "fuzz-secret-0123456789abcdef0123456789"
IDENTITY = create_identity(
    IdentitySpec.model_validate(
        {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret": SECRET, "audience": "fg"}}
    )
)


def _dumps(value: object) -> bytes:
    """Any JSON, big integers included (orjson would refuse to write those)."""
    return json.dumps(value).encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(_dumps),
    st.fixed_dictionaries(
        {"model": st.text(max_size=8)},
        optional={
            "max_tokens": json_values | st.integers(-(2**70), 2**70),
            "max_completion_tokens": json_values,
            "min_tokens": json_values | st.integers(0, 5000),
            "n": json_values | st.integers(0, 4),
            "best_of": json_values | st.integers(0, 4),
            "priority": json_values,
            "service_tier": json_values,
            "stream": json_values,
            "prompt": json_values | st.text(max_size=50),
            "messages": json_values
            | st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "system"]), "content": json_values}
                ),
                max_size=3,
            ),
            "temperature": json_values,
            "surprise": json_values,
            # work the meter does not see: refused, bounded or counted
            "stop": json_values | st.lists(st.text(max_size=80), max_size=12),
            "stop_token_ids": json_values | st.lists(st.integers(0, 9), max_size=30),
            "bad_words": st.lists(st.text(max_size=3), max_size=30),
            "logit_bias": json_values
            | st.dictionaries(st.text(max_size=3), st.integers(), max_size=30),
            "guided_json": json_values,
            "guided_choice": st.lists(st.text(max_size=20), max_size=8),
            "response_format": json_values,
            "top_logprobs": json_values | st.integers(0, 30),
            "logprobs": json_values | st.integers(0, 30),
            "echo": json_values,
            "chat_template_kwargs": json_values
            | st.fixed_dictionaries(
                {}, optional={"documents": st.text(max_size=300), "chat_template": st.text()}
            ),
            "prompt_logprobs": json_values,
            "chat_template": json_values,
            "logits_processors": json_values,
        },
    ).map(_dumps),
    st.integers(200, 400).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(200, 400).map(
        lambda depth: b'{"prompt":"x","a":' + b"[" * depth + b"]" * depth + b"}"
    ),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=bodies,
    chat=st.booleans(),
    policy=st.sampled_from(["refuse", "drop", "forward"]),
    priority=st.sampled_from([None, 0, 1]),
)
def test_any_body_is_normalized_within_the_metered_work_or_refused_with_a_4xx(
    raw, chat, policy, priority
):
    """A body either becomes forwarded bytes whose output cap is the metered ℓ (≤ the
    limit), with at most one sequence, no client scheduling field and `min_tokens` ≤ ℓ, or
    is refused with a 400 naming why; nothing else is raised."""
    limits = EdgeLimits(
        max_tokens=4096,
        default_max_tokens=16,
        unknown_fields=policy,
        max_stop=8,
        max_list_items=20,
        max_logit_bias=20,
        max_constraint_bytes=64,
        max_top_logprobs=5,
    )
    try:
        work = normalize(raw, chat=chat, limits=limits, priority=priority)
    except BadRequestError as exc:
        assert exc.status == 400 and exc.kind
        return
    forwarded = json.loads(work.body)
    assert isinstance(forwarded, dict)
    assert forwarded["max_tokens"] == work.num_output_tokens
    assert 1 <= work.num_output_tokens <= 4096
    assert forwarded.get("max_completion_tokens", work.num_output_tokens) == work.num_output_tokens
    assert forwarded.get("min_tokens") in (None, *range(work.num_output_tokens + 1))
    assert forwarded.get("n", 1) == 1 and forwarded.get("best_of", 1) == 1
    assert forwarded.get("priority") == priority
    assert not (set(forwarded) & SCHEDULING_FIELDS - {"priority"})
    assert 0 <= (work.min_prompt_tokens or 0) <= work.num_prompt_tokens <= 32768
    assert isinstance(forwarded.get("stream", False), bool)
    _within_the_bounds(forwarded, work.num_prompt_tokens, chat)


def _within_the_bounds(forwarded: dict, num_prompt_tokens: int, chat: bool) -> None:
    """What the sampler and a guided decoder walk is bounded, nothing costly is forwarded,
    and what a chat template renders is inside the metered prompt."""
    assert not set(forwarded) & COSTLY_FIELDS
    stop = forwarded.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    assert len(stops) <= 8 and all(len(json.dumps(x).encode()) <= 64 for x in stops)
    for key in TOKEN_LISTS:
        assert not isinstance(forwarded.get(key), list) or len(forwarded[key]) <= 20
    bias = forwarded.get("logit_bias")
    assert not isinstance(bias, dict | list) or len(bias) <= 20
    for key in CONSTRAINTS:
        if key in forwarded:
            assert len(json.dumps(forwarded[key], ensure_ascii=False).encode()) <= 64
    for key in ("top_logprobs", "logprobs"):
        value = forwarded.get(key)
        assert type(value) is not int or value <= 5
    kwargs = forwarded.get("chat_template_kwargs")
    if chat and isinstance(kwargs, dict):
        assert "chat_template" not in kwargs
        assert num_prompt_tokens >= len(json.dumps(kwargs, ensure_ascii=False).encode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


segments = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=60).map(_b64),
    json_values.map(lambda v: _b64(_dumps(v))),
    st.sampled_from([_b64(b'{"alg":"none"}'), _b64(b'{"alg":"HS256","typ":"JWT"}'), ""]),
)
tokens = st.one_of(
    st.text(max_size=80),
    st.lists(segments, min_size=1, max_size=4).map(".".join),
    st.fixed_dictionaries(
        {"sub": json_values, "exp": json_values, "aud": json_values, "nbf": json_values},
    ).map(lambda claims: jwt.encode(claims, SECRET, algorithm="HS256")),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token=tokens, scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]))
def test_any_authorization_header_names_a_tenant_or_is_refused(token, scheme):
    try:
        tenant = IDENTITY.tenant_of({"Authorization": scheme + token})
    except AuthError as exc:
        assert exc.status == 401 and exc.kind
        return
    claims = jwt.decode(token.strip(), SECRET, algorithms=["HS256"], audience="fg")
    assert tenant == claims["sub"] and claims["exp"] > time.time() - 1


def test_a_token_expiring_in_10_to_the_400_is_refused_not_a_500():
    """`exp` = 10^400 is a valid JSON integer that overflows a float: 401, not a crash."""
    token = jwt.encode({"sub": "acme", "aud": "fg", "exp": 10**400}, SECRET, algorithm="HS256")
    try:
        IDENTITY.tenant_of({"Authorization": f"Bearer {token}"})
    except AuthError as exc:
        assert (exc.status, exc.kind) == (401, "invalid_token")
    else:
        raise AssertionError("accepted a token with an infinite expiry")
