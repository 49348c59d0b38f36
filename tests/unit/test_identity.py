"""Identity → tenant (docs/design.md §2): JWT verification and its cache, mTLS certificate names,
and the configuration checks that refuse unsafe or incomplete identity setups."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from floorguard.clock import ManualClock
from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import (
    GuardServerConfig,
    IdentitySpec,
    JwtSpec,
    TlsSpec,
    load_config,
    server_ssl_context,
)
from floorguard.proxy.edge.identity import AuthError, create_identity

SECRET = "unit-secret-0123456789abcdef0123456789"


def hs256(clock=None, **spec):
    return create_identity(
        IdentitySpec.model_validate(
            {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret": SECRET, **spec}}
        ),
        clock=clock,
    )


def bearer(claims, secret=SECRET, algorithm="HS256"):
    return {"Authorization": "Bearer " + jwt.encode(claims, secret, algorithm=algorithm)}


def refused(identity, headers, peercert=None):
    with pytest.raises(AuthError) as caught:
        identity.tenant_of(headers, peercert)
    return caught.value.status, caught.value.kind


def test_a_valid_token_names_its_tenant_and_a_cached_one_still_expires():
    """On the guard's clock (a manual one here): valid until `exp` + leeway, then refused,
    from the cache too."""
    clock = ManualClock(1_000_000.0)
    identity = hs256(clock, leeway_s=5)
    headers = bearer({"sub": "acme", "exp": 1_000_010})
    assert identity.tenant_of(headers) == "acme"
    clock.jump(1_000_015.0)
    assert identity.tenant_of(headers) == "acme"  # from the cache, inside the leeway
    clock.advance(0.5)
    assert refused(identity, headers) == (401, "expired_token")


@pytest.mark.parametrize(
    ("claims", "kind"),
    [
        ({"exp": 2_000_000, "nbf": 1_000_100}, "invalid_token"),  # not yet valid
        ({"exp": 2_000_000, "iat": 1_000_100}, "invalid_token"),  # issued in the future
        ({"exp": "2000000"}, "invalid_token"),  # a NumericDate is a number
        ({"exp": True}, "invalid_token"),
        ({"exp": 10**400}, "invalid_token"),  # not a finite time
        ({"exp": 999_999}, "expired_token"),
    ],
)
def test_the_token_times_are_judged_on_the_guards_clock(claims, kind):
    identity = hs256(ManualClock(1_000_000.0))
    assert refused(identity, bearer({"sub": "acme", **claims})) == (401, kind)
    fine = hs256(ManualClock(1_000_000.0))
    assert fine.tenant_of(bearer({"sub": "acme", "exp": 1_000_001, "nbf": 1_000_000})) == "acme"


def test_a_forged_token_is_refused_even_after_the_genuine_one_was_cached():
    identity = hs256()
    claims = {"sub": "acme", "exp": time.time() + 60}
    assert identity.tenant_of(bearer(claims)) == "acme"
    assert refused(identity, bearer(claims, secret="x" * 40)) == (401, "invalid_token")
    unsigned = jwt.encode(claims, None, algorithm="none")
    assert refused(identity, {"Authorization": f"Bearer {unsigned}"}) == (401, "invalid_token")


def test_missing_claims_and_headers_are_401():
    identity = hs256(issuer="https://auth", audience="fg")
    assert refused(identity, {}) == (401, "missing_identity")
    assert refused(identity, {"Authorization": "Basic abc"}) == (401, "missing_identity")
    assert refused(identity, bearer({"sub": "acme"})) == (401, "invalid_token")  # no exp
    wrong_audience = {"sub": "a", "exp": time.time() + 60, "iss": "https://auth", "aud": "x"}
    assert refused(identity, bearer(wrong_audience)) == (401, "invalid_token")


def test_the_cache_is_bounded():
    identity = hs256()
    identity._cache_size = 3
    for i in range(10):
        assert identity.tenant_of(bearer({"sub": f"t{i}", "exp": time.time() + 60})) == f"t{i}"
    assert len(identity._verified) == 3


def test_algorithm_confusion_and_short_secrets_are_refused_at_start():
    with pytest.raises(ConfigError, match="algorithm confusion"):
        create_identity(
            IdentitySpec.model_validate(
                {"mode": "jwt", "jwt": {"algorithms": ["HS256", "RS256"], "secret": SECRET}}
            )
        )
    with pytest.raises(ConfigError, match="at least 32"):
        hs256(secret="short")


def test_a_secret_from_the_environment_names_the_variable_when_it_is_missing_or_short():
    spec = IdentitySpec.model_validate(
        {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "secret_env": "FLOORGUARD_JWT_SECRET"}}
    )
    with pytest.raises(ConfigError) as missing:
        create_identity(spec, environ={})
    assert "FLOORGUARD_JWT_SECRET is not set" in str(missing.value)
    with pytest.raises(ConfigError) as short:
        create_identity(spec, environ={"FLOORGUARD_JWT_SECRET": "x" * 10})
    assert "FLOORGUARD_JWT_SECRET has 10" in str(short.value)
    assert "x" * 10 not in str(short.value)  # never the secret itself
    assert create_identity(spec, environ={"FLOORGUARD_JWT_SECRET": SECRET}) is not None


CERT = {
    "subject": ((("organizationName", "Acme"),), (("commonName", "acme"),)),
    "subjectAltName": (("DNS", "acme.tenants.internal"), ("URI", "spiffe://fleet/acme")),
}


@pytest.mark.parametrize(
    ("source", "tenant"),
    [("cn", "acme"), ("san-dns", "acme.tenants.internal"), ("san-uri", "spiffe://fleet/acme")],
)
def test_mtls_names_the_tenant_from_the_verified_certificate(source, tenant):
    identity = create_identity(
        IdentitySpec.model_validate({"mode": "mtls", "mtls": {"tenant_from": source}})
    )
    assert identity.tenant_of({}, CERT) == tenant
    assert refused(identity, {"Authorization": "Bearer x"}, None) == (401, "missing_identity")
    assert refused(identity, {}, {}) == (401, "missing_identity")  # presented, unverified


def test_mtls_without_the_name_asked_for_is_401():
    identity = create_identity(
        IdentitySpec.model_validate({"mode": "mtls", "mtls": {"tenant_from": "san-uri"}})
    )
    assert refused(identity, {}, {"subject": CERT["subject"]}) == (401, "invalid_identity")


def test_mtls_needs_a_client_ca_and_readable_files(tmp_path):
    path = tmp_path / "guard.yaml"
    path.write_text(
        "contracts: [{tenant: acme, class: assured, floor: 1, deadline_ms: 1000}]\n"
        "backends: [{url: 'http://127.0.0.1:1', slots: 1}]\n"
        "identity: {mode: mtls}\n"
    )
    with pytest.raises(ConfigError, match="client_ca_file"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot be loaded"):
        server_ssl_context(TlsSpec(cert_file=tmp_path / "no.crt", key_file=tmp_path / "no.key"))
    assert GuardServerConfig.model_fields["tls"].default is None


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[2].glob("examples/*.yaml")))
def test_the_example_configs_validate(path, monkeypatch):
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "x" * 32)
    config = load_config(path)
    assert config.contracts and all(pool.backends for pool in config.pools().values())


def _jwks_identity(tmp_path, keys):
    """An RS256+ES256 identity over a JWKS file holding `keys` (kid → private key)."""
    entries = []
    for kid, private in keys.items():
        algorithm = RSAAlgorithm if isinstance(private, rsa.RSAPrivateKey) else ECAlgorithm
        entries.append({**json.loads(algorithm.to_jwk(private.public_key())), "kid": kid})
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": entries}))
    return create_identity(
        IdentitySpec.model_validate(
            {"mode": "jwt", "jwt": {"algorithms": ["RS256", "ES256"], "jwks_file": str(path)}}
        )
    )


def test_a_jwks_picks_the_key_by_kid_and_refuses_confusion(tmp_path):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    identity = _jwks_identity(tmp_path, {"r1": rsa_key, "e1": ec_key})
    claims = {"sub": "acme", "exp": time.time() + 60}

    def signed(key, algorithm, kid):
        token = jwt.encode(claims, key, algorithm=algorithm, headers={"kid": kid})
        return {"Authorization": f"Bearer {token}"}

    assert identity.tenant_of(signed(rsa_key, "RS256", "r1")) == "acme"
    assert identity.tenant_of(signed(ec_key, "ES256", "e1")) == "acme"
    assert refused(identity, signed(ec_key, "ES256", "r1")) == (401, "invalid_token")
    assert refused(identity, signed(rsa_key, "RS256", "nope")) == (401, "invalid_token")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refused(identity, signed(other, "RS256", "r1")) == (401, "invalid_token")
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # algorithm confusion: HS256 "signed" with the RSA public key as the HMAC secret
    segments = [
        _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "r1"}).encode()),
        _b64(json.dumps(claims).encode()),
    ]
    mac = hmac.new(public_pem, ".".join(segments).encode(), hashlib.sha256).digest()
    forged = ".".join([*segments, _b64(mac)])
    assert refused(identity, {"Authorization": f"Bearer {forged}"}) == (401, "invalid_token")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_jwks_without_usable_keys_is_refused_at_start(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "s"}]}))
    with pytest.raises(ConfigError, match="jwks_file"):
        create_identity(
            IdentitySpec.model_validate(
                {"mode": "jwt", "jwt": {"algorithms": ["RS256"], "jwks_file": str(path)}}
            )
        )


@pytest.mark.parametrize("kind", ["rsa", "ec"])
def test_a_pem_key_verifies_only_its_own_algorithm(tmp_path, kind):
    """RS256 and ES256 both configured, one PEM key: a token in the other algorithm (or
    HS256 keyed with the public key) is a 401, never a 500."""
    private = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if kind == "rsa"
        else ec.generate_private_key(ec.SECP256R1())
    )
    other = (
        ec.generate_private_key(ec.SECP256R1())
        if kind == "rsa"
        else rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path = tmp_path / "key.pem"
    path.write_bytes(pem)
    spec = {"algorithms": ["RS256", "ES256"], "public_key_file": str(path)}
    identity = create_identity(IdentitySpec.model_validate({"mode": "jwt", "jwt": spec}))
    own, foreign = ("RS256", "ES256") if kind == "rsa" else ("ES256", "RS256")
    claims = {"sub": "acme", "exp": time.time() + 60}
    assert identity.tenant_of(bearer(claims, private, own)) == "acme"
    assert refused(identity, bearer(claims, other, foreign)) == (401, "invalid_token")
    with pytest.raises(ConfigError, match=f"is a {own} key"):
        create_identity(
            IdentitySpec.model_validate({"mode": "jwt", "jwt": {**spec, "algorithms": [foreign]}})
        )


def test_one_source_of_public_keys():
    """`public_key_file`, `jwks_file` and `jwks_url` exclude each other; a URL is http(s)."""
    with pytest.raises(ValueError, match="one of public_key_file, jwks_file, jwks_url"):
        JwtSpec.model_validate(
            {"algorithms": ["RS256"], "jwks_file": "k.json", "jwks_url": "https://idp/jwks"}
        )
    with pytest.raises(ValueError, match="jwks_url"):
        JwtSpec.model_validate({"algorithms": ["RS256"], "jwks_url": "file:///etc/jwks"})
