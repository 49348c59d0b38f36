"""Fuzzing what a client controls before the core runs: the request body and the
Authorization header. Whatever arrives, parsing ends in a value or the one refusal type
(a 4xx), never another exception (which would be a 500)."""

from __future__ import annotations

import base64
import json
import time

import jwt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floorguard.proxy.config import IdentitySpec
from floorguard.proxy.identity import AuthError, create_identity
from floorguard.proxy.openai_format import BadRequestError, parse_body

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
            "stream": json_values,
            "prompt": json_values,
        },
    ).map(_dumps),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=bodies)
def test_any_body_parses_or_is_refused_with_a_4xx(raw):
    try:
        body, max_tokens = parse_body(raw, max_tokens_cap=4096, default_max_tokens=16)
    except BadRequestError as exc:
        assert exc.status in (400, 413) and exc.kind
        return
    assert isinstance(body, dict)
    assert type(max_tokens) is int and 1 <= max_tokens <= 4096
    assert isinstance(body.get("stream", False), bool)


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
