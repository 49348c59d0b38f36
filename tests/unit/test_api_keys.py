"""The guard's own API keys (docs/http.md): stored hashed, looked up by id and compared in
constant time, refused when revoked, malformed or issued by another deployment, seen by a
running guard within a second of a revocation; beside JWT, never in a URL."""

from __future__ import annotations

import hmac
import json

import pytest

from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import IdentitySpec
from floorguard.proxy.edge import api_keys
from floorguard.proxy.edge.api_keys import KeyRing, create_key, list_keys, revoke_key
from floorguard.proxy.edge.identity import AuthError, create_identity
from tests.integration.live import AUDIENCE, ISSUER, SECRET, token


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_shown_once_and_the_file_keeps_only_its_hash(tmp_path):
    path = tmp_path / "keys.json"
    key, entry = create_key(path, "acme", now=1000.0)
    text = path.read_text()
    secret = key.split("_", 2)[2]
    assert key.startswith(f"fgk_{entry.id}_") and secret not in text and key not in text
    assert path.stat().st_mode & 0o777 == 0o600
    assert [(k.id, k.tenant) for k in list_keys(path)] == [(entry.id, "acme")]
    assert KeyRing(path).tenant_of(key) == "acme"


def test_a_wrong_secret_a_malformed_key_and_another_deployments_key_are_refused(tmp_path):
    path = tmp_path / "keys.json"
    key, entry = create_key(path, "acme", now=1000.0)
    ring = KeyRing(path)
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert ring.tenant_of(wrong) is None  # the right id, a wrong secret
    for bad in ("", "fgk_", key + "x", key.replace("fgk_", "fgx_"), f"fgk_{entry.id}"):
        assert ring.tenant_of(bad) is None
    # another deployment's file
    elsewhere, _ = create_key(tmp_path / "other.json", "acme", now=1000.0)
    assert ring.tenant_of(elsewhere) is None
    data = json.loads(path.read_text())  # the same id and secret under another namespace
    data["namespace"] = "f" * 32
    (tmp_path / "copied.json").write_text(json.dumps(data))
    assert KeyRing(tmp_path / "copied.json").tenant_of(key) is None


def test_the_secret_is_compared_in_constant_time(tmp_path, monkeypatch):
    path = tmp_path / "keys.json"
    key, _ = create_key(path, "acme", now=1000.0)
    compared = []
    constant_time = hmac.compare_digest

    def compare(a, b):
        compared.append((a, b))
        return constant_time(a, b)

    monkeypatch.setattr(api_keys.hmac, "compare_digest", compare)
    assert KeyRing(path).tenant_of(key) == "acme"
    assert len(compared) == 1 and compared[0][0] == compared[0][1]


def test_a_revocation_reaches_a_running_ring_within_a_second(tmp_path):
    path = tmp_path / "keys.json"
    key, entry = create_key(path, "acme", now=1000.0)
    other, _ = create_key(path, "beta", now=1000.0)
    clock = Clock()
    ring = KeyRing(path, clock=clock)
    revoke_key(path, entry.id, now=1000.0)
    assert ring.tenant_of(key) == "acme"  # not looked at again yet
    clock.now = api_keys.REFRESH_S
    assert ring.tenant_of(key) is None
    assert ring.tenant_of(other) == "beta"
    assert revoke_key(path, entry.id, now=1000.0).revoked_at == list_keys(path)[0].revoked_at
    with pytest.raises(ConfigError, match="no key"):
        revoke_key(path, "00000000", now=1000.0)


def test_a_broken_file_keeps_the_keys_read_before_while_serving(tmp_path):
    path = tmp_path / "keys.json"
    key, _ = create_key(path, "acme", now=1000.0)
    clock = Clock()
    ring = KeyRing(path, clock=clock)
    path.write_text("{not json")
    clock.now = 5.0
    assert ring.tenant_of(key) == "acme"
    with pytest.raises(ConfigError, match="not a keys file"):
        KeyRing(path)  # at start or reload: refused


def _identity(tmp_path, mode="jwt"):
    path = tmp_path / "keys.json"
    key, _ = create_key(path, "acme", now=1000.0)
    spec = {"mode": mode, "api_keys_file": str(path)}
    if mode == "jwt":
        spec["jwt"] = {
            "algorithms": ["HS256"],
            "secret": SECRET,
            "issuer": ISSUER,
            "audience": AUDIENCE,
        }
    return create_identity(IdentitySpec.model_validate(spec), {}), key


def test_keys_sit_beside_jwt_and_a_credential_in_the_url_is_refused(tmp_path):
    identity, key = _identity(tmp_path)
    assert identity.tenant_of({"Authorization": f"Bearer {key}"}) == "acme"
    assert identity.tenant_of({"Authorization": f"Bearer {token('beta')}"}) == "beta"
    with pytest.raises(AuthError) as refused:
        identity.tenant_of({"Authorization": f"Bearer {key}x"})
    assert (refused.value.status, refused.value.kind) == (401, "invalid_api_key")
    for name in ("api_key", "API-KEY", "token"):
        with pytest.raises(AuthError) as refused:
            identity.tenant_of({}, query={name: key})
        assert (refused.value.status, refused.value.kind) == (400, "credentials_in_url")


def test_mode_api_key_takes_keys_only(tmp_path):
    identity, key = _identity(tmp_path, mode="api_key")
    assert identity.tenant_of({"Authorization": f"Bearer {key}"}) == "acme"
    with pytest.raises(AuthError, match="unknown or revoked"):
        identity.tenant_of({"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x"})
    with pytest.raises(AuthError, match="API key is required"):
        identity.tenant_of({})
    with pytest.raises(ValueError, match="api_keys_file"):
        IdentitySpec.model_validate({"mode": "api_key"})


def test_an_expired_key_is_refused_and_a_label_is_kept(tmp_path):
    """`keys create --expires-in`: accepted until its expiry, refused from then (on the
    ring's wall clock); the label shows in the list. An old file's keys (no such fields)
    read as unlabelled and never expiring."""
    path = tmp_path / "keys.json"
    wall = Clock()
    wall.now = 1000.0
    key, _ = create_key(path, "acme", now=1000.0, label="batch job", expires_at=1060.0)
    ring = KeyRing(path, wall=wall)
    assert ring.tenant_of(key) == "acme"
    wall.now = 1060.0
    assert ring.tenant_of(key) is None
    assert [(k.label, k.expires_at) for k in list_keys(path)] == [("batch job", 1060.0)]
    with pytest.raises(ConfigError, match="after the key's creation"):
        create_key(path, "acme", now=1000.0, expires_at=1000.0)
    data = json.loads(path.read_text())
    for old in data["keys"]:
        del old["label"], old["expires_at"]
    path.write_text(json.dumps(data))
    assert [(k.label, k.expires_at) for k in list_keys(path)] == [("", None)]


def test_keys_create_refuses_a_tenant_the_config_has_no_contract_for(tmp_path, capsys):
    """With `--config`, a typo is refused (naming the tenants there), not issued a key that
    never works; the right tenant gets its key, its label and its expiry."""
    from floorguard.cli import main  # noqa: PLC0415  # only this test

    config = tmp_path / "guard.yaml"
    config.write_text(
        "contracts:\n"
        "  - {tenant: acme, class: assured, floor: 4, deadline_ms: 1820}\n"
        "backends: [{url: 'http://127.0.0.1:8000', slots: 4}]\n"
        "identity: {mode: api_key, api_keys_file: keys.json}\n"
    )
    keys = tmp_path / "keys.json"
    args = ["keys", "create", "--file", str(keys), "--config", str(config)]
    assert main([*args, "acem"]) == 2
    err = capsys.readouterr().err
    assert "no contract for it" in err and "acme" in err
    assert not keys.exists()
    assert main([*args, "acme", "--label", "ci", "--expires-in", "30d", "--json"]) == 0
    issued = json.loads(capsys.readouterr().out)
    assert issued["label"] == "ci"
    assert issued["expires_at"] == pytest.approx(issued["created_at"] + 30 * 86400)
