"""One refusal table (`core/refusals.py`) read by every place a refusal shows: a reason the
core can give that a reader does not know fails here — the table, the HTTP answer, the
checker's judgement, the metrics' label, docs/trace.md."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from floorguard.analysis.checker import check_trace
from floorguard.core.contract import ContractClass
from floorguard.core.events import EventKind
from floorguard.core.refusals import (
    AUTO_RETRY,
    REFUSALS,
    WINDOW_BOUND,
    AfJudgement,
    Retry,
    trace_table,
)
from floorguard.core.surface import Admission, RejectReason
from floorguard.proxy.edge.refusals import refusal
from floorguard.proxy.observe.metrics import GuardMetrics
from floorguard.sim.run import simulate_once
from floorguard.sim.scenarios import marquee

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_reason_has_exactly_one_row():
    assert list(REFUSALS) == list(RejectReason)
    assert {r for r, row in REFUSALS.items() if row.retry is Retry.NEXT_WINDOW} == WINDOW_BOUND
    assert {RejectReason.QUEUE_FULL, RejectReason.BUSY} == AUTO_RETRY


@pytest.mark.parametrize("reason", list(RejectReason))
def test_the_edge_answers_each_reason_as_its_row_says(reason):
    row = REFUSALS[reason]
    admission = Admission(1, False, ContractClass.ASSURED, False, False, 3, None, reason, 4.2)
    response = refusal(admission, 2.5, {"x-ratelimit-limit-requests": "6"})
    body = orjson.loads(response.body)  # type: ignore[arg-type]
    assert response.status == row.status
    assert body["error"]["code"] == reason
    retry_s = 2 if row.retry is Retry.NEXT_WINDOW else 1
    assert body["error"]["message"] == row.message.format(retry_s=retry_s)
    if row.status == 429:
        assert response.headers["Retry-After"] == str(retry_s)
        assert (response.headers.get("x-should-retry") == "false") == (row.retry is not Retry.SOON)


def test_a_reason_outside_the_table_is_refused_without_a_retry():
    admission = Admission(1, False, ContractClass.ASSURED, False, False, 3, None, "rate_limited")
    response = refusal(admission, 0.0, {})
    assert response.status == 429 and response.headers["x-should-retry"] == "false"


@pytest.fixture(scope="module")
def marquee_events():
    return simulate_once(marquee(), seed=3).events


def refused_entitled(events, reason, *, capacity_action="alarm"):
    """The trace with its first floor-entitled admission turned into a refusal for `reason`
    (the request's later events removed), under the given capacity action."""
    at = next(i for i, e in enumerate(events) if e.kind is EventKind.ADMIT and e.entitled)
    rid = events[at].request_id
    config = events[0]._replace(data={**events[0].data, "capacity_action": capacity_action})
    refused = events[at]._replace(kind=EventKind.REJECT, entitled=None, reason=str(reason))
    rest = [e for e in events[at + 1 :] if e.request_id != rid]
    return [config, *events[1:at], refused, *rest]


@pytest.mark.parametrize("reason", list(RejectReason))
def test_the_checker_judges_a_refused_entitled_request_by_its_row(marquee_events, reason):
    row = REFUSALS[reason]
    report = check_trace(refused_entitled(marquee_events, reason))
    assert [v.prop for v in report.violations] == ["AF"]  # a violation under `alarm`, always
    lowered = check_trace(refused_entitled(marquee_events, reason, capacity_action="lower-floor"))
    assert lowered.ok() == (row.af is AfJudgement.LOWERED_FLOOR)


def test_the_metrics_label_every_reason_as_itself_even_past_the_label_cap():
    metrics = GuardMetrics({}, lambda: 0.0)
    for i in range(300):
        metrics._reason(f"driver_reason_{i}")
    assert metrics._reason("driver_reason_299") == "other"
    assert all(metrics._reason(str(reason)) == reason for reason in REFUSALS)


def test_docs_trace_md_carries_the_table():
    """Regenerate with `python scripts/refusal_reference.py`."""
    assert trace_table() in (DOCS / "trace.md").read_text()
