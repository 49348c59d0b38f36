"""Identity → tenant, before anything else runs (design §2). A request with no valid identity
is refused, never given a class.

JWT (pyjwt): every key is bound to one algorithm at start (an HMAC secret to HS256, an RSA
public key to RS256, a P-256 key to ES256; a JWKS key to its `alg`), and a token is checked
with its key's algorithm only, so `alg: none` and algorithm confusion (an RS256 public key
used as an HS256 secret) are refused by construction;
`exp`, `nbf`, `iss`, `aud` are checked. mTLS: the TLS layer has verified the client's
certificate against the configured CA; its subject CN (or first DNS/URI SAN) is the tenant.
Header mode trusts a header only from a configured upstream: the request's source address
must lie in `trusted_upstreams`, and a header given twice is refused (a client's copy must
never win over the gateway's). The same holds for `Authorization` in JWT mode.

A verified token is remembered (token string → tenant, expiry; at most `cache_size`), so a
client that reuses its token pays the signature check once; every use still checks `exp`.
Only a byte-identical token hits the cache, so a forged or altered one is always verified.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from floorguard.clock import Clock, WallClock
from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import IdentitySpec, JwtSpec
from floorguard.proxy.config.identity import sample_secret
from floorguard.proxy.edge.api_keys import KeyRing, looks_like_key
from floorguard.proxy.edge.jwks import JwksSource, bind_jwks

__all__ = [
    "AuthError",
    "Identity",
    "PeerCert",
    "UnknownKidError",
    "create_identity",
    "peer_address",
]

BoundKey = tuple[str | Any, str]
"""A verification key and the one algorithm it may verify."""
Key = BoundKey | Mapping[str, BoundKey]
"""One bound key, or a JWKS's bound keys by `kid`."""
PeerCert = Mapping[str, Any]
"""A verified peer certificate as `ssl.SSLSocket.getpeercert()` decodes it."""


class AuthError(Exception):
    """No valid identity: `status` 401 (missing/invalid) or 403 (valid but not allowed)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class UnknownKidError(AuthError):
    """A token whose `kid` the key set does not hold (a provider may have rotated its key:
    with `jwks_url`, the caller fetches the set again and asks once more)."""


CREDENTIAL_WORDS = (
    "key", "token", "auth", "secret", "passw", "credential", "bearer", "jwt", "session",
    "signature",
)  # fmt: skip
"""A query parameter whose name holds one of these (case, `-` and `_` aside) may carry a
credential: `api_key`, `?authorization=`, `?x-api-key=`, `access_token`, … — refused, never
read (a URL ends up in proxies' and servers' logs)."""


def credential_in_query(query: Mapping[str, str]) -> bool:
    """Whether a URL's query names a credential or carries what looks like one (a guard
    key, a bearer header, a JWT) under any name."""
    for name, value in query.items():
        folded = name.lower().replace("-", "").replace("_", "")
        if any(word in folded for word in CREDENTIAL_WORDS):
            return True
        if looks_like_key(value) or value.lower().startswith("bearer") or _is_jwt(value):
            return True
    return False


def _is_jwt(value: str) -> bool:
    return value.startswith("eyJ") and value.count(".") == 2


class Identity:
    def __init__(
        self,
        spec: IdentitySpec,
        key: Key | None,
        *,
        keys: KeyRing | None = None,
        cache_size: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        self.spec = spec
        self.key = key
        self.keys = keys
        self.jwks = key if isinstance(key, JwksSource) else None
        """With `jwks_url`: the fetched key set (the server fetches it at start)."""
        self.clock: Clock = WallClock() if clock is None else clock
        """Seconds since the epoch: what a token's `exp`, `nbf` and `iat` are judged on."""
        self._verified: dict[str, tuple[str, float]] = {}
        self._cache_size = cache_size
        self._trusted = [ipaddress.ip_network(c, strict=False) for c in spec.trusted_upstreams]

    def tenant_of(
        self,
        headers: Mapping[str, str],
        peercert: PeerCert | None = None,
        peer: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> str:
        """The tenant of a request, from its headers or its verified client certificate
        (`ssl.SSLSocket.getpeercert()`); `peer`: its source address; `query`: its URL's
        parameters (a credential there is refused). AuthError if none."""
        if query and credential_in_query(query):
            raise AuthError(
                400,
                "credentials_in_url",
                "a credential in the URL's query is refused (URLs are logged): send it as "
                "Authorization: Bearer",
            )
        if self.spec.mode == "mtls":
            return self._from_certificate(peercert)
        if self.spec.mode == "header":
            assert self.spec.header is not None
            if not self._from_trusted_upstream(peer):
                raise AuthError(
                    403,
                    "untrusted_upstream",
                    "tenant headers are accepted only from the configured upstream",
                )
            tenant = _single(headers, self.spec.header).strip()
            if not tenant:
                raise AuthError(401, "missing_identity", f"header {self.spec.header} is required")
            return tenant
        return self._from_bearer(headers)

    def _from_trusted_upstream(self, peer: str | None) -> bool:
        address = peer_address(peer)
        return address is not None and any(address in network for network in self._trusted)

    def _from_bearer(self, headers: Mapping[str, str]) -> str:
        """`Authorization: Bearer`: one of the guard's keys, or a JWT."""
        auth = _single(headers, "Authorization")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        keys_only = self.spec.mode == "api_key"
        if scheme.lower() != "bearer" or not token:
            what = "API key" if keys_only else "JWT"
            raise AuthError(401, "missing_identity", f"an Authorization: Bearer {what} is required")
        if self.keys is not None and (keys_only or looks_like_key(token)):
            tenant = self.keys.tenant_of(token)
            if tenant is None:
                raise AuthError(401, "invalid_api_key", "the API key is unknown or revoked")
            return tenant
        return self._from_jwt(token)

    def _from_jwt(self, token: str) -> str:
        spec = self.spec.jwt
        assert spec is not None and self.key is not None
        bound = self.key
        if not isinstance(bound, tuple):  # a JWKS: the token's `kid` picks the key
            try:
                kid = jwt.get_unverified_header(token).get("kid")
            except jwt.InvalidTokenError as exc:
                raise AuthError(401, "invalid_token", f"the JWT is not valid: {exc}") from exc
            if not isinstance(kid, str) or kid not in bound:
                shown = str(kid)[:80]
                why = f"no key with kid {shown!r} in the JWKS"
                raise UnknownKidError(401, "invalid_token", why)
            bound = bound[kid]
        key, algorithm = bound
        now = self.clock.now()
        known = self._verified.get(token)
        if known is not None:
            tenant, expires_at = known
            if now <= expires_at + spec.leeway_s:
                return tenant
            del self._verified[token]
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                issuer=spec.issuer,
                audience=spec.audience,
                options={
                    "require": ["exp"],
                    "verify_exp": False,  # the times are judged on the guard's clock:
                    "verify_nbf": False,  # `_check_times`
                    "verify_iat": False,
                },
            )
        except (jwt.PyJWTError, TypeError, ValueError, OverflowError) as exc:  # crafted: never 500
            raise AuthError(401, "invalid_token", f"the JWT is not valid: {exc}") from exc
        claimed = claims.get(spec.tenant_claim)
        if not isinstance(claimed, str) or not claimed:
            raise AuthError(401, "invalid_token", f"the JWT has no {spec.tenant_claim!r} claim")
        expires_at = _check_times(claims, now, spec.leeway_s)
        if len(self._verified) >= self._cache_size:
            del self._verified[next(iter(self._verified))]  # the oldest entry
        self._verified[token] = (claimed, expires_at)
        return claimed

    def _from_certificate(self, peercert: PeerCert | None) -> str:
        if not peercert:
            raise AuthError(401, "missing_identity", "a client certificate is required")
        source = self.spec.mtls.tenant_from
        if source == "cn":
            names = [v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"]
        else:
            kind = "DNS" if source == "san-dns" else "URI"
            names = [v for k, v in peercert.get("subjectAltName", ()) if k == kind]
        if not names or not names[0]:
            raise AuthError(401, "invalid_identity", f"the client certificate has no {source}")
        return str(names[0])


def peer_address(remote: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A request's source address (`aiohttp`'s `request.remote`, a zone id dropped), or None
    when it is not an IP address (a Unix socket)."""
    try:
        return ipaddress.ip_address((remote or "").split("%")[0])
    except ValueError:
        return None


def _single(headers: Mapping[str, str], name: str) -> str:
    """The header's one value ("" if absent); given more than once, refused."""
    getall = getattr(headers, "getall", None)
    values = getall(name, []) if getall is not None else [headers.get(name, "")]
    if len(values) > 1:
        raise AuthError(400, "duplicate_identity", f"header {name} is given more than once")
    return values[0] if values else ""


def _hs256_secret(jwt_spec: JwtSpec, environ: Mapping[str, str]) -> str:
    """The HS256 secret: given, or from its file (read again at each reload), or from its
    environment variable; at least 32 characters, and not a sample (`sample_secret`)."""
    secret, where = _hs256_secret_of(jwt_spec, environ)
    why = sample_secret(secret)
    if why is not None:
        raise ConfigError(
            where,
            "<hidden>",
            f"the HS256 secret is refused: {why}. Generate one: openssl rand -hex 32",
        )
    return secret


def _hs256_secret_of(jwt_spec: JwtSpec, environ: Mapping[str, str]) -> tuple[str, str]:
    """The HS256 secret and the key it came from, its length checked."""
    env = jwt_spec.secret_env
    secret = jwt_spec.secret or (environ.get(env, "") if env else "")
    if jwt_spec.secret_file is not None:
        try:
            secret = jwt_spec.secret_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                "identity.jwt.secret_file", str(jwt_spec.secret_file), f"cannot be read ({exc})"
            ) from exc
        if len(secret) < 32:
            raise ConfigError(
                "identity.jwt.secret_file",
                str(jwt_spec.secret_file),
                f"HS256 needs a secret of at least 32 characters; the file holds {len(secret)}",
            )
        return secret, "identity.jwt.secret_file"
    if not jwt_spec.secret and env and env not in environ:
        raise ConfigError(
            "identity.jwt.secret_env",
            env,
            f"the environment variable {env} is not set: export it (HS256 needs a shared "
            "secret of at least 32 characters)",
        )
    from_env = not jwt_spec.secret and env is not None
    key = "identity.jwt.secret_env" if from_env else "identity.jwt.secret"
    if len(secret) < 32:
        raise ConfigError(
            key,
            env if from_env else "<hidden>",
            "HS256 needs a secret of at least 32 characters; "
            f"{f'the environment variable {env}' if from_env else 'it'} has {len(secret)}",
        )
    return secret, key


def _numeric_date(claims: Mapping[str, Any], name: str) -> float | None:
    """A time claim as seconds since the epoch (RFC 7519 NumericDate: a finite JSON number),
    None where the token has none."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthError(401, "invalid_token", f"the JWT's {name} is not a number")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise AuthError(401, "invalid_token", f"the JWT's {name} is not a finite time")
    return seconds


def _check_times(claims: Mapping[str, Any], now: float, leeway_s: float) -> float:
    """PyJWT verifies the signature, `iss` and `aud`; the times are judged here, on the
    guard's clock (PyJWT would read the wall clock itself): `exp` (required) must not have
    passed, `nbf` and `iat` (where given) must not be in the future, each with `leeway_s`.
    Returns the expiry."""
    expires_at = _numeric_date(claims, "exp")
    assert expires_at is not None  # PyJWT required it
    if now > expires_at + leeway_s:
        raise AuthError(401, "expired_token", "the JWT has expired")
    for name in ("nbf", "iat"):
        at = _numeric_date(claims, name)
        if at is not None and now + leeway_s < at:
            raise AuthError(401, "invalid_token", f"the JWT's {name} is in the future")
    return expires_at


def create_identity(
    spec: IdentitySpec,
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
    jwks: JwksSource | None = None,
) -> Identity:
    """The identity `spec` configures; `jwks`: the running server's fetched key set, kept
    where a reload names the same `jwks_url` and algorithms."""
    environ = os.environ if environ is None else environ
    clock = WallClock() if clock is None else clock  # a key's expiry: the epoch's seconds
    keys = KeyRing(spec.api_keys_file, wall=clock.now) if spec.api_keys_file is not None else None
    if spec.mode == "api_key":
        return Identity(spec, None, keys=keys, clock=clock)
    if spec.mode == "mtls":
        return Identity(spec, None, clock=clock)
    if spec.mode == "header":
        if not spec.header:
            raise ConfigError("identity.header", spec.header, "header mode needs a header name")
        return Identity(spec, None, clock=clock)
    if spec.jwt is None:
        raise ConfigError("identity.jwt", None, "jwt mode needs a jwt section")
    algorithms = set(spec.jwt.algorithms)
    if algorithms & {"HS256"} and algorithms - {"HS256"}:
        raise ConfigError(
            "identity.jwt.algorithms",
            sorted(algorithms),
            "HS256 cannot be mixed with public-key algorithms (algorithm confusion)",
        )
    if algorithms == {"HS256"}:
        return Identity(spec, (_hs256_secret(spec.jwt, environ), "HS256"), keys=keys, clock=clock)
    return Identity(spec, _public_key(spec.jwt, algorithms, clock, jwks), keys=keys, clock=clock)


def _public_key(
    spec: JwtSpec, algorithms: Collection[str], clock: Clock, jwks: JwksSource | None
) -> Key:
    """RS256 / ES256: the JWKS file's keys, the JWKS URL's source (the running one where a
    reload names the same URL and algorithms), or the PEM key."""
    if spec.jwks_file is not None:
        return _read_jwks(spec.jwks_file, algorithms)
    if spec.jwks_url is not None:
        if jwks is None or (jwks.url, jwks.algorithms) != (spec.jwks_url, frozenset(algorithms)):
            jwks = JwksSource(
                spec.jwks_url,
                algorithms,
                refresh_s=spec.jwks_refresh_s,
                min_refresh_s=spec.jwks_min_refresh_s,
                clock=clock,
            )
        jwks.refresh_s, jwks.min_refresh_s = spec.jwks_refresh_s, spec.jwks_min_refresh_s
        return jwks
    if spec.public_key_file is None:
        raise ConfigError(
            "identity.jwt.public_key_file",
            None,
            "RS256/ES256 need a PEM public key, a jwks_file or a jwks_url",
        )
    return _read_pem(spec.public_key_file, algorithms)


def _read_pem(path: Path, algorithms: Collection[str]) -> BoundKey:
    """A PEM public key bound to its algorithm: RSA → RS256, EC P-256 → ES256."""
    field = "identity.jwt.public_key_file"
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(field, str(path), f"cannot be read as a PEM public key ({exc})") from exc
    if isinstance(key, rsa.RSAPublicKey):
        algorithm = "RS256"
    elif isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        algorithm = "ES256"
    else:
        raise ConfigError(field, str(path), "must be an RSA or EC P-256 public key")
    if algorithm not in algorithms:
        allowed = sorted(algorithms)
        raise ConfigError(field, str(path), f"is a {algorithm} key; algorithms has {allowed}")
    return key, algorithm


def _read_jwks(path: Path, algorithms: Collection[str]) -> dict[str, BoundKey]:
    """The JWKS file's keys, bound (`jwks.bind_jwks`)."""
    field = "identity.jwt.jwks_file"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(field, str(path), f"cannot be read as a JWKS ({exc})") from exc
    return bind_jwks(text, algorithms, field, str(path))
