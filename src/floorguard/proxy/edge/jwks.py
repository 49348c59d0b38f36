"""A JWKS (JSON Web Key Set) fetched from an identity provider's URL (`identity.jwt.jwks_url`):
its RSA/EC keys by `kid`, each bound to its algorithm as a `jwks_file`'s are (`bind_jwks`).

An identity provider rotates its signing key by publishing the new key in its JWKS, signing
with it, and later dropping the old one. The guard follows without a restart: it fetches
the set at start (a set that cannot be fetched refuses the start), again every
`jwks_refresh_s` in the background (a failed fetch keeps the keys held, with a warning),
and again when a token names a `kid` it does not hold — at most once per
`jwks_min_refresh_s` and one fetch at a time, so tokens with made-up `kid`s cannot make
the guard hammer the provider. The fetch is aiohttp's, on the event loop (PyJWT's
`PyJWKClient` would block it); the parsing is PyJWT's (`PyJWKSet`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import aiohttp
import jwt

from floorguard.clock import Clock
from floorguard.errors import ConfigError

__all__ = ["JwksSource", "bind_jwks"]

log = logging.getLogger("floorguard.proxy")

BoundKey = tuple[Any, str]
"""A verification key and the one algorithm it may verify."""

_FETCH_TIMEOUT_S = 5.0
_MAX_BYTES = 1 << 20


def bind_jwks(
    text: str, algorithms: Collection[str], field: str, where: str
) -> dict[str, BoundKey]:
    """A JWKS document's RSA/EC public keys by `kid`, each bound to its algorithm (its `alg`,
    else its type's default: a token must use exactly that one). A key without a `kid`, or
    whose algorithm is not configured, is left out; none left is a `ConfigError` naming
    `field` and `where` the set came from."""
    try:
        jwks = jwt.PyJWKSet.from_json(text)
    except (jwt.PyJWKSetError, jwt.InvalidKeyError, ValueError, TypeError) as exc:
        raise ConfigError(field, where, f"cannot be read as a JWKS ({exc})") from exc
    keys: dict[str, BoundKey] = {
        jwk.key_id: (jwk.key, jwk.algorithm_name)
        for jwk in jwks.keys
        if jwk.key_id and jwk.key_type in {"RSA", "EC"} and jwk.algorithm_name in algorithms
    }
    if not keys:
        raise ConfigError(field, where, f"has no RSA/EC key with a kid for {sorted(algorithms)}")
    return keys


class JwksSource(Mapping[str, BoundKey]):
    """The keys of the JWKS at `url`, as last fetched (a mapping `kid` → bound key, empty
    until the first fetch)."""

    field = "identity.jwt.jwks_url"

    def __init__(
        self,
        url: str,
        algorithms: Collection[str],
        *,
        refresh_s: float,
        min_refresh_s: float,
        clock: Clock,
    ) -> None:
        self.url = url
        self.algorithms = frozenset(algorithms)
        self.refresh_s = refresh_s
        self.min_refresh_s = min_refresh_s
        self.clock = clock
        self.session: aiohttp.ClientSession | None = None
        """Set by the server at start (its side session)."""
        self.fetches = 0
        """Fetches sent (`/admin/status`)."""
        self._keys: dict[str, BoundKey] = {}
        self._fetched_at: float | None = None
        self._inflight: asyncio.Future[bool] | None = None

    def __getitem__(self, kid: str) -> BoundKey:
        return self._keys[kid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def status(self) -> dict[str, object]:
        return {"url": self.url, "kids": sorted(self._keys), "fetches": self.fetches}

    async def fetch(self) -> bool:
        """Fetch the set now (joining a fetch in flight): whether its keys changed. A
        `ConfigError` where it cannot be fetched or read; the keys held stay."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._fetch())
        return await asyncio.shield(self._inflight)

    async def fetch_for_unknown_kid(self) -> None:
        """A token named a `kid` this set does not hold: fetch again, unless a fetch ran less
        than `min_refresh_s` ago (then join the one in flight, if any). A failure is a
        warning, the keys held stay."""
        inflight = self._inflight is not None and not self._inflight.done()
        recent = (
            self._fetched_at is not None
            and self.clock.now() - self._fetched_at < self.min_refresh_s
        )
        if recent and not inflight:
            return
        await self.refresh()

    async def refresh(self) -> None:
        """Fetch again (every `refresh_s`, the server's background task): a failure is a
        warning, the keys held stay."""
        try:
            await self.fetch()
        except ConfigError as exc:
            log.warning("identity: the JWKS could not be refreshed (keeping %d keys): %s",
                        len(self._keys), exc)  # fmt: skip

    async def _fetch(self) -> bool:
        if self.session is None:
            raise RuntimeError("JwksSource.session is set at the server's start")
        self.fetches += 1
        self._fetched_at = self.clock.now()
        try:
            async with self.session.get(
                self.url,
                timeout=aiohttp.ClientTimeout(total=_FETCH_TIMEOUT_S),
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    raise ConfigError(self.field, self.url, f"answered HTTP {response.status}")
                body = await response.content.read(_MAX_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConfigError(self.field, self.url, f"cannot be fetched ({exc!r})") from exc
        if len(body) > _MAX_BYTES:
            raise ConfigError(self.field, self.url, f"is larger than {_MAX_BYTES} bytes")
        keys = bind_jwks(body.decode("utf-8", "replace"), self.algorithms, self.field, self.url)
        changed = keys.keys() != self._keys.keys()
        if changed:
            log.info("identity: the JWKS at %s holds kids %s", self.url, sorted(keys))
        self._keys = keys
        return changed
