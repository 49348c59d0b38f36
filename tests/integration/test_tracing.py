"""Traces (docs/http.md, Traces) through a real `floorguard serve`: the client's W3C trace context
reaches the backend (a malformed one does not), and with `tracing:` each request's span
arrives at a real OTLP/HTTP receiver on loopback — decoded with OpenTelemetry's own protobuf
types — as a child of the client's `traceparent`, with the guard's decision on it, while the
backend is handed the guard's span as its parent. The decision log verifies afterwards."""

from __future__ import annotations

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.integration.test_attacks import ENTITLED, guard_process

pytest_plugins = ["tests.integration.test_attacks"]  # its `scripted` backend fixture

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it is sent, decoded."""

    def __init__(self) -> None:
        self.spans: list = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        return app

    async def _export(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")


def _attributes(span) -> dict:
    return {a.key: a.value.string_value or a.value.int_value for a in span.attributes}


def test_the_clients_trace_context_goes_on_to_the_backend_and_a_bad_one_does_not(
    tmp_path, scripted
):
    backend, url = scripted
    backend.traces.clear()
    with guard_process(tmp_path, [url]) as guard:
        guard.post(ENTITLED, headers={"traceparent": PARENT, "tracestate": "vendor=1"})
        guard.post(ENTITLED, headers={"traceparent": "00-not-a-trace-01", "tracestate": "x=1"})
        guard.post(ENTITLED, headers={"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"})
        guard.post(ENTITLED, headers={"traceparent": PARENT, "tracestate": "v=" + "x" * 600})
    assert backend.traces[-4:] == [
        (PARENT, "vendor=1"),
        (None, None),
        (None, None),
        (PARENT, None),  # a tracestate past W3C's size is not forwarded, the parent is
    ]


def test_each_request_is_a_span_under_the_clients_trace(tmp_path, scripted, live):
    backend, url = scripted
    backend.traces.clear()
    receiver = Receiver()
    endpoint, _ = live.serve(receiver.app)
    contracts = [
        {"tenant": "acme", "class": "assured", "floor": 1, "deadline_ms": 1820,
         "excess_policy": "reject"},
        {"tenant": "free", "class": "opportunistic", "deadline_ms": 1820},
    ]  # fmt: skip
    tracing = {"otlp_endpoint": endpoint + "/v1/traces", "service_name": "guard-under-test"}
    with guard_process(
        tmp_path, [url], contracts=contracts, window_s=3600.0, tracing=tracing
    ) as guard:
        served, *_ = guard.post(ENTITLED, headers={"traceparent": PARENT})
        refused, *_ = guard.post(ENTITLED, headers={"traceparent": PARENT})
        untraced, *_ = guard.post(ENTITLED, tenant="free")
    assert (served, refused, untraced) == (200, 429, 200)  # the SIGTERM flushed the spans
    spans = [s for s in receiver.spans if s.name == "floorguard.request"]
    assert len(spans) == 3
    first, second, third = sorted(spans, key=lambda s: s.start_time_unix_nano)
    for span in (first, second):
        assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == CLIENT_SPAN
    assert third.trace_id.hex() != TRACE_ID and not third.parent_span_id  # a new trace
    assert _attributes(first)["floorguard.decision"] == "entitled"
    assert _attributes(first)["floorguard.tenant"] == "acme"
    assert _attributes(first)["floorguard.backend"] == url
    assert _attributes(second)["floorguard.decision"] == "rejected"
    assert _attributes(second)["http.response.status_code"] == 429
    assert _attributes(third)["floorguard.class"] == "opportunistic"
    sent = backend.traces[-2:]  # the backend's parent is the guard's span, not the client's
    assert sent[0][0] == f"00-{TRACE_ID}-{first.span_id.hex()}-01"
    assert sent[1][0].split("-")[1] == third.trace_id.hex()


@pytest.mark.parametrize("endpoint", ["collector:4318", "ftp://x/v1/traces"])
def test_a_tracing_endpoint_that_is_not_a_url_is_refused_at_start(endpoint):
    from floorguard.proxy.config.sections import TracingSpec  # noqa: PLC0415

    with pytest.raises(ValueError, match="not an http"):
        TracingSpec(otlp_endpoint=endpoint)
