"""The rate-limit headers OpenAI's clients read (docs/design.md §17), from the tenant's floor and
window: what the guard reserved for the tenant in the window it counted the request in,
what is left of it after this request, and when the window rolls.

    x-ratelimit-limit-requests      B: the tenant's floor (0: nothing reserved, an
                                    opportunistic tenant is served from the surplus only)
    x-ratelimit-remaining-requests  credits left in that window after this request
    x-ratelimit-reset-requests      until the next window, as OpenAI writes it (`250ms`, `1s`,
                                    `1m30s`)

Under the token meter (`meter: token`) the floor is in tokens and the three are
`x-ratelimit-*-tokens` instead. A header the guard cannot fill is left out, never sent
empty: `remaining` without a store call (an assured tenant refused before one)."""

from __future__ import annotations

from floorguard.core.contract import MeterKind
from floorguard.core.surface import Pending
from floorguard.windows import WindowSchedule

__all__ = ["duration", "rate_limit_headers"]


def duration(seconds: float) -> str:
    """`seconds` as OpenAI's headers write a reset: `250ms` under a second, else Go's
    duration form (`1s`, `1.5s`, `1m30s`, `1h0m0s`)."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, ms = divmod(rest, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


def rate_limit_headers(
    pending: Pending, meter: MeterKind, schedule: WindowSchedule, now: float
) -> dict[str, str]:
    """The headers for the arrival `pending` (decided), at `now` on the guard's clock: the
    window it was counted in (`x-floorguard-window`; a surplus request, counted in none,
    the window it arrived in) and the tenant's floor in it. An opportunistic tenant gets no
    `x-ratelimit-*` headers: nothing is reserved for it, and a `remaining: 0` would tell a
    client that backs off on it to stop, while the surplus it is served from has room."""
    contract = pending.contract
    if contract is None:  # no contract: nothing reserved to speak of
        return {}
    admission = pending.admission
    window = admission.window_index if admission is not None else None
    if window is None:  # a surplus request is counted in no window: the clock's
        window = schedule.index_at(now)
    reset_s = min(max(0.0, schedule.start_of(window + 1) - now), schedule.window_s)
    if not contract.assured:
        return {"x-floorguard-window": str(window)}
    reset, limit, remaining = _NAMES[meter]
    out = {"x-floorguard-window": str(window), reset: duration(reset_s)}
    if pending.remaining is None:  # refused before its floor was asked (cost-excess)
        out[limit] = str(contract.floor)
        return out
    # the floor the window was judged against: a shared store's pinned one, or this
    # guard's effective floor (`lower-floor` may have cut it below the contract's)
    floor = pending.pinned if pending.pinned is not None else pending.floor
    out[limit] = str(floor)
    out[remaining] = str(max(0, pending.remaining))
    return out


_NAMES = {
    meter: tuple(
        f"x-ratelimit-{name}-{'tokens' if meter is MeterKind.TOKEN else 'requests'}"
        for name in ("reset", "limit", "remaining")
    )
    for meter in MeterKind
}
"""By meter: the reset, limit and remaining headers' names (built once, not per request)."""
