"""Builders with keyword defaults, shared by every test (docs/design.md §18.10)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from floorguard.core.contract import (
    AffineEnvelope,
    Contract,
    ContractClass,
    DispatchOrder,
    ExcessPolicy,
    GuardConfig,
    MeterKind,
    WindowSchedule,
)
from floorguard.core.events import TraceEvent
from floorguard.core.guard import Guard
from floorguard.core.learner import Learner
from floorguard.core.request import Request
from floorguard.learners.adversaries import AlwaysAdmit

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure-llm-2023"
ASSURED = ContractClass.ASSURED
OPPORTUNISTIC = ContractClass.OPPORTUNISTIC

_ids: Iterator[int] = iter(range(10**9))


def make_request(
    *,
    assured: bool = True,
    tokens: int = 16,
    at: float = 0.0,
    tenant: str | None = None,
    prompt: int = 0,
    request_id: int | None = None,
) -> Request:
    name = tenant if tenant is not None else ("a95" if assured else "a10")
    return Request(request_id if request_id is not None else next(_ids), name, at, tokens, prompt)


def make_config(
    *,
    floor: int = 2,
    slots: tuple[int, ...] = (1,),
    deadline_s: float = 1.0,
    window_s: float = 1.0,
    origin_at: float = 0.0,
    dispatch: DispatchOrder = DispatchOrder.ASSURED_FIRST,
    meter: MeterKind = MeterKind.COUNT,
    excess: ExcessPolicy = ExcessPolicy.REJECT,
    lower: AffineEnvelope | None = None,
    upper: AffineEnvelope | None = None,
) -> GuardConfig:
    return GuardConfig(
        contracts=(
            Contract("a95", ASSURED, deadline_s, floor, excess),
            Contract("a10", OPPORTUNISTIC, deadline_s),
        ),
        schedule=WindowSchedule(window_s, origin_at),
        slots=slots,
        dispatch=dispatch,
        meter=meter,
        lower_envelope=lower,
        upper_envelope=upper,
    )


def make_guard(
    config: GuardConfig | None = None,
    *,
    learner: Learner | None = None,
    events: list[TraceEvent] | None = None,
) -> Guard:
    return Guard(
        config if config is not None else make_config(),
        learner=learner if learner is not None else AlwaysAdmit(),
        sink=events.append if events is not None else None,
    )


BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def write_burstgpt(
    path: Path, count: int, *, gap_s: float, response_tokens=lambda i: 8, cv: float = 0.0
) -> Path:
    """A BurstGPT-format CSV of `count` rows `gap_s` apart on average: evenly (`cv` 0), or
    with gamma gaps of that coefficient of variation (seeded)."""
    if cv > 0:
        gaps = np.random.default_rng(0).gamma(1 / cv**2, gap_s * cv**2, count)
        at = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    else:
        at = np.arange(count) * gap_s
    rows = [f"{at[i]:.3f},ChatGPT,10,{response_tokens(i)},0,Conversation log" for i in range(count)]
    path.write_text(BURSTGPT_HEADER + "\n" + "\n".join(rows) + "\n")
    return path
