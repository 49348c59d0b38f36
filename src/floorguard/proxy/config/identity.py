"""The identity part of the guard server's configuration (`identity:`, `tls:`): JWT,
mTLS and trusted-header identity, and the server's own TLS — and the strict base every
section of the file is validated with (`config.py` holds the rest)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

__all__ = ["IdentitySpec", "JwtSpec", "MtlsSpec", "Strict", "TlsSpec", "sample_secret"]

_SAMPLE_MARKS = ("replace", "changeme", "change-me", "change_me", "placeholder", "example")
"""Words a shipped or documented sample secret carries, which a generated one never does."""


def sample_secret(value: str) -> str | None:
    """Why `value` is a sample, not a secret — a shipped placeholder (`deploy/kubernetes`'s
    `REPLACE-with-…`) or the like, public to anyone who read the files — or None."""
    lowered = value.lower()
    for mark in _SAMPLE_MARKS:
        if mark in lowered:
            return f"it is a sample value (it says {mark!r}), public to anyone who read it"
    return None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class JwtSpec(Strict):
    algorithms: list[Literal["HS256", "RS256", "ES256"]] = Field(min_length=1)
    """The algorithms a token may be signed with (never `none`)."""
    secret: str | None = None
    """HS256 shared secret (or `secret_env`: the name of an environment variable)."""
    secret_env: str | None = None
    """The environment variable holding the HS256 secret."""
    secret_file: Path | None = None
    """Or a file holding it (a mounted Kubernetes Secret): read at start and again at each
    reload, so a rotated secret takes effect without a restart."""
    public_key_file: Path | None = None
    """PEM public key for RS256 / ES256."""
    jwks_file: Path | None = None
    """Or a JWKS (JSON Web Key Set) file for RS256 / ES256: the token's `kid` picks the key."""
    jwks_url: str | None = Field(default=None, pattern=r"^https?://")
    """Or the URL an identity provider publishes its JWKS at (RS256 / ES256): fetched at
    start (one that cannot be fetched refuses the start), every `jwks_refresh_s`, and when a
    token names a `kid` not held (at most once per `jwks_min_refresh_s`), so a rotated
    signing key is followed without a restart."""
    jwks_refresh_s: float = Field(default=300.0, gt=0)
    """How often the JWKS at `jwks_url` is fetched again."""
    jwks_min_refresh_s: float = Field(default=10.0, ge=0)
    """The least time between two fetches of `jwks_url` for tokens naming an unknown `kid`
    (tokens with made-up `kid`s cannot make the guard hammer the provider)."""

    @model_validator(mode="after")
    def _one_key_source(self) -> JwtSpec:
        given = [
            name
            for name in ("public_key_file", "jwks_file", "jwks_url")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give one of public_key_file, jwks_file, jwks_url (not {given})")
        return self

    issuer: str | None = None
    """The `iss` a token must carry (none: not checked)."""
    audience: str | None = None
    """The `aud` a token must carry (none: not checked)."""
    tenant_claim: str = "sub"
    """The claim that names the tenant."""
    leeway_s: float = Field(default=0.0, ge=0, le=300)
    """Clock skew allowed on `exp` / `nbf`."""


class MtlsSpec(Strict):
    tenant_from: Literal["cn", "san-dns", "san-uri"] = "cn"
    """Which part of the verified client certificate names the tenant: the subject's common
    name, or the first DNS / URI subject-alternative name."""


class IdentitySpec(Strict):
    mode: Literal["jwt", "api_key", "mtls", "header"]
    """Where the tenant comes from: a JWT bearer token (or one of the guard's API keys,
    beside it), only the guard's API keys, a client certificate, or a header set by a named
    gateway."""
    jwt: JwtSpec | None = None
    """`mode: jwt`: how tokens are checked."""
    api_keys_file: Path | None = None
    """The guard's own API keys (`floorguard keys create|list|revoke`), stored hashed:
    needed by `mode: api_key`; with `mode: jwt`, a bearer token that starts `fgk_` is
    checked as a key instead of a JWT. Read again when it changes (within a second) and at
    each reload, so a revoked key is refused without a restart."""
    mtls: MtlsSpec = MtlsSpec()
    """`mode: mtls`: needs `tls.client_ca_file` (the CA that signs tenants' certificates)."""
    header: str | None = None
    """`mode: header`: the header a trusted upstream sets (configured explicitly, design §2)."""
    trusted_upstreams: list[str] = Field(default_factory=list)
    """`mode: header`: the source address ranges (CIDR, e.g. `10.0.0.5/32`) of the upstream
    that sets `header`; a request from any other address is refused 403 whatever it sends."""

    @field_validator("trusted_upstreams")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not an address range (CIDR): {exc}") from None
        return value

    @model_validator(mode="after")
    def _keys_where_they_are_read(self) -> IdentitySpec:
        if self.mode == "api_key" and self.api_keys_file is None:
            raise ValueError("mode api_key needs `api_keys_file` (floorguard keys create)")
        if self.api_keys_file is not None and self.mode not in ("jwt", "api_key"):
            raise ValueError("`api_keys_file` is read in mode jwt or api_key only")
        return self

    @model_validator(mode="after")
    def _header_needs_upstreams(self) -> IdentitySpec:
        if self.mode == "header" and (not self.header or not self.trusted_upstreams):
            raise ValueError(
                "mode header needs `header` and `trusted_upstreams` (the address ranges of "
                "the gateway that sets it): without them any client could name any tenant"
            )
        return self


class TlsSpec(Strict):
    cert_file: Path
    """The server certificate (PEM)."""
    key_file: Path
    """Its private key (PEM)."""
    client_ca_file: Path | None = None
    """Verify client certificates against this CA bundle (needed by `identity.mode: mtls`).
    A client that presents none reaches the guard and gets 401; one that presents a
    certificate this CA did not sign fails the TLS handshake."""
