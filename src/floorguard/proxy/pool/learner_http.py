"""An out-of-process learner: the guard POSTs each surplus request's summary to a URL and
applies the answer as the learner's proposal (docs/design.md §2: untrusted, proposes only).

The guard's arrival is sans-IO: it asks (`LearnerAsk`) only for a surplus request, and the
server awaits `ask` and hands the answer back (`continue_arrival`), so a floor-entitled
request never waits on the callout. A timeout, a connection error, a non-2xx answer or a
malformed body becomes a learner fault: the surplus request is rejected (`learner_fault`)
and counted, and the guard keeps serving.

Wire format (JSON):

    request  {"request_id", "tenant", "class", "max_tokens", "prompt_tokens",
              "load": {"in_flight", "queued_entitled", "queued_surplus", "slots"}}
    response {"admit": bool, "proposed_class": "assured" | "opportunistic" | null,
              "priority_hint": number}
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp
import orjson

from floorguard.core.contract import ContractClass
from floorguard.core.learner import Consultation, Proposal
from floorguard.core.surface import LearnerAsk

__all__ = ["HttpLearner", "LearnerCalloutError", "parse_proposal"]


class LearnerCalloutError(Exception):
    """The learner service gave no usable answer (the guard records it as a fault)."""


class HttpLearner:
    """The learner as a service: `ask` answers the guard's `LearnerAsk` over HTTP."""

    name = "http"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.outcomes: Counter[str] = Counter()
        """Callout outcomes: ok, timeout, error."""

    async def ask(self, session: aiohttp.ClientSession, ask: LearnerAsk) -> Consultation:
        """The service's proposal for one surplus request, or the fault (never raises
        for the service's failures)."""
        request, load = ask.request, ask.load
        summary = {
            "request_id": request.request_id,
            "tenant": request.tenant,
            "class": ask.cls.value,
            "max_tokens": request.num_output_tokens,
            "prompt_tokens": request.num_prompt_tokens,
            "load": {
                "in_flight": load.num_in_flight,
                "queued_entitled": load.num_queued_entitled,
                "queued_surplus": load.num_queued_surplus,
                "slots": load.num_slots,
            },
        }
        try:
            async with session.post(
                self.url,
                data=orjson.dumps(summary),
                headers={"Content-Type": "application/json"},
                timeout=self._timeout,
            ) as response:
                if response.status >= 300:
                    raise LearnerCalloutError(f"the learner answered HTTP {response.status}")
                proposal = parse_proposal(orjson.loads(await response.read()))
        except TimeoutError:
            self.outcomes["timeout"] += 1
            return _fault(LearnerCalloutError(f"no answer within {self.timeout_s * 1e3:.0f} ms"))
        except (aiohttp.ClientError, orjson.JSONDecodeError, LearnerCalloutError) as exc:
            self.outcomes["error"] += 1
            return _fault(exc)
        self.outcomes["ok"] += 1
        return Consultation(proposal, None)


def _fault(exc: Exception) -> Consultation:
    error = exc if isinstance(exc, LearnerCalloutError) else LearnerCalloutError(exc)
    return Consultation(None, f"{type(error).__name__}: {error}"[:120])


def parse_proposal(body: Any) -> Proposal:
    """A proposal from the service's JSON; anything off-schema is a callout error."""
    if not isinstance(body, dict) or type(body.get("admit")) is not bool:
        raise LearnerCalloutError(f"not a proposal: {str(body)[:80]}")
    relabel = body.get("proposed_class")
    hint = body.get("priority_hint", 0.0)
    try:
        proposed = ContractClass(relabel) if relabel is not None else None
    except ValueError as exc:
        raise LearnerCalloutError(f"unknown proposed_class {relabel!r}") from exc
    if type(hint) not in (int, float):
        raise LearnerCalloutError(f"priority_hint {hint!r} is not a number")
    return Proposal(body["admit"], proposed, float(hint))
