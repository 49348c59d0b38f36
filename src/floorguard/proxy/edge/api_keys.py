"""The guard's own API keys: issued per tenant, stored hashed, revocable
without a restart.

A key reads `fgk_<id>_<secret>`: `id` (8 hex digits) is public and names the entry, the
secret is 32 random bytes (url-safe base64). The keys file keeps, per key, its id, tenant,
creation and revocation times and `sha256(namespace ‖ secret)` — never the key: it is shown
once, when it is created. `namespace` is random per file, so the same secret issued by
another deployment does not match here.

A presented key is looked up by its id (not by its secret) and its hash compared with
`hmac.compare_digest`, so the time a check takes does not depend on how much of a guessed
secret is right. The guard reads the file again when it changes (checked at most once a
second, and at each reload), so `floorguard keys revoke` takes effect within a second
without a restart or a signal.

The file is JSON, written whole to a temporary file and renamed over the old one (a
reader never sees half a file), mode 0600; two `keys` commands at once take turns (a lock
file beside it), so neither loses the other's key.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from floorguard.errors import ConfigError

__all__ = [
    "KEY_PREFIX",
    "ApiKey",
    "KeyRing",
    "create_key",
    "list_keys",
    "looks_like_key",
    "revoke_key",
]

KEY_PREFIX = "fgk_"
_KEY = re.compile(r"^fgk_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$")
REFRESH_S = 1.0
"""How often, at most, the guard looks whether the keys file changed."""


@dataclass(frozen=True)
class ApiKey:
    id: str
    tenant: str
    sha256: str
    created_at: float
    revoked_at: float | None = None
    label: str = ""
    """What the operator said it is for (`keys create --label`)."""
    expires_at: float | None = None
    """Seconds since the epoch after which it is refused (None: never)."""


def looks_like_key(token: str) -> bool:
    """Whether a bearer token is meant as one of the guard's keys (its prefix)."""
    return token.startswith(KEY_PREFIX)


def _digest(namespace: str, secret: str) -> str:
    return hashlib.sha256(f"{namespace}:{secret}".encode()).hexdigest()


def _read(path: Path) -> tuple[str, list[ApiKey]]:
    try:
        data = json.loads(path.read_text())
        keys = [ApiKey(**entry) for entry in data["keys"]]
        namespace = data["namespace"]
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("identity.api_keys_file", str(path), f"not a keys file ({exc})") from exc
    if not isinstance(namespace, str) or not namespace:
        raise ConfigError("identity.api_keys_file", str(path), "has no namespace")
    return namespace, keys


def _write(path: Path, namespace: str, keys: list[ApiKey]) -> None:
    body = json.dumps(
        {"version": 1, "namespace": namespace, "keys": [asdict(k) for k in keys]}, indent=1
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(body + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer at a time on the keys file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def create_key(
    path: Path,
    tenant: str,
    *,
    now: float,
    label: str = "",
    expires_at: float | None = None,
) -> tuple[str, ApiKey]:
    """Issue a key for `tenant` in the keys file at `path` (created if missing): the key,
    shown this once, and its entry; `now`: seconds since the epoch, its creation time;
    `expires_at`: when it stops being accepted (None: never)."""
    if not tenant or tenant != tenant.strip():
        raise ConfigError("tenant", tenant, "must be a non-empty name without spaces around it")
    if expires_at is not None and not expires_at > now:
        raise ConfigError("expires", expires_at, "must be after the key's creation")
    with _locked(path):
        try:
            namespace, keys = _read(path)
        except FileNotFoundError:
            namespace, keys = secrets.token_hex(16), []
        taken = {k.id for k in keys}
        key_id = secrets.token_hex(4)
        while key_id in taken:
            key_id = secrets.token_hex(4)
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        entry = ApiKey(key_id, tenant, _digest(namespace, secret), now, None, label, expires_at)
        _write(path, namespace, [*keys, entry])
    return f"{KEY_PREFIX}{key_id}_{secret}", entry


def list_keys(path: Path) -> list[ApiKey]:
    return _read(path)[1]


def revoke_key(path: Path, key_id: str, *, now: float) -> ApiKey:
    """Revoke the key `key_id` (its entry stays, marked, so the list says when)."""
    with _locked(path):
        namespace, keys = _read(path)
        for i, entry in enumerate(keys):
            if entry.id != key_id:
                continue
            if entry.revoked_at is not None:
                return entry
            keys[i] = ApiKey(**{**asdict(entry), "revoked_at": now})
            _write(path, namespace, keys)
            return keys[i]
    raise ConfigError("key", key_id, f"no key with this id in {path}")


class KeyRing:
    """The keys file as the guard reads it: the tenant of a presented key, or None."""

    def __init__(self, path: Path, *, clock: Any = time.monotonic, wall: Any = time.time) -> None:
        self.path = path
        self._clock = clock
        self._wall = wall
        """Seconds since the epoch, for a key's expiry (the file's times are the epoch's)."""
        self._namespace = ""
        self._by_id: dict[str, ApiKey] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked_at = -float("inf")
        self.load()

    def load(self) -> None:
        """Read the file (at start, at a reload, and when it changed); a bad file is a
        `ConfigError` at start or reload, and keeps the keys read before while serving."""
        try:
            stat = self.path.stat()
            namespace, keys = _read(self.path)
        except FileNotFoundError as exc:
            raise ConfigError("identity.api_keys_file", str(self.path), "does not exist") from exc
        self._namespace = namespace
        self._by_id = {k.id: k for k in keys}
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        self._checked_at = self._clock()

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked_at < REFRESH_S:
            return
        self._checked_at = now
        try:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size) != self._stamp:
                self.load()
        except (OSError, ConfigError):
            pass  # a file being replaced, or broken: keep what was read; the next look retries

    def tenant_of(self, key: str) -> str | None:
        """The tenant `key` was issued to; None for an unknown, malformed or revoked key."""
        self._refresh()
        match = _KEY.match(key)
        if match is None:
            return None
        entry = self._by_id.get(match.group(1))
        if entry is None:
            _digest(self._namespace, match.group(2))  # the same work as a known id
            return None
        presented = _digest(self._namespace, match.group(2))
        if not hmac.compare_digest(presented, entry.sha256) or entry.revoked_at is not None:
            return None
        if entry.expires_at is not None and self._wall() >= entry.expires_at:
            return None
        return entry.tenant
