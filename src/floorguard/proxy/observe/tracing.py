"""Traces: the client's W3C trace context carried through the guard, and, with
`tracing.otlp_endpoint`, an OpenTelemetry span per request exported over OTLP/HTTP.

Without `tracing:` the guard forwards a client's well-formed `traceparent` (and its
`tracestate`) to the backend as they came, so vLLM's own spans join the client's trace;
a malformed one is dropped, never forwarded. With it, each request admitted to a pool is
one span, `floorguard.request`, whose parent is the client's `traceparent` (a new trace
where it sent none); the backend gets the span's own context, so the backend's spans nest
under the guard's. The span carries what the guard decided: the tenant, the class, the
decision (`entitled`, `surplus`, `rejected`, `dropped`), the window, the queue wait, the
backend, and the HTTP status; a 5xx is an error status.

OpenTelemetry is an extra (`pip install 'floorguard[otel]'`), imported only when
`tracing:` is configured: a guard without it pays a header lookup per request.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from floorguard.errors import ConfigError
from floorguard.proxy.config.sections import TracingSpec

__all__ = ["RequestSpan", "Tracing", "client_trace_context"]

_TRACEPARENT = re.compile(
    r"^(?!ff)([0-9a-f]{2})-((?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2})(-.*)?$"
)
"""W3C Trace Context: version `ff` is forbidden; version `00` is exactly the four fields; a
later version may add fields after them, and is read as `00` (its first four fields)."""
MAX_TRACESTATE = 512
"""The longest `tracestate` forwarded (W3C's 32 members fit; a longer one is dropped)."""


def client_trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's trace context, where it is well-formed (W3C): what to forward upstream,
    as version `00`."""
    match = _TRACEPARENT.match(headers.get("traceparent", ""))
    if match is None:
        return {}
    version, fields, extra = match.groups()
    if version == "00" and extra is not None:
        return {}
    out = {"traceparent": "00-" + fields}
    state = headers.get("tracestate", "")
    if state and len(state) <= MAX_TRACESTATE and state.isascii():
        out["tracestate"] = state
    return out


class RequestSpan:
    """One request's span: attributes as the guard decides, the context it hands on."""

    __slots__ = ("_propagator", "_span")

    def __init__(self, span: Any, propagator: Any) -> None:
        self._span = span
        self._propagator = propagator

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)

    def upstream_context(self) -> dict[str, str]:
        """The span's own `traceparent` (and `tracestate`), for the backend."""
        from opentelemetry import trace  # noqa: PLC0415 (the extra: module docstring)

        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def end(self, status: int) -> None:
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        self._span.end()


class Tracing:
    """The guard's tracer: spans exported in batches to `spec.otlp_endpoint`."""

    def __init__(self, spec: TracingSpec, *, replica: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )
            from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
            from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
            from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
            from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415
                ParentBased,
                TraceIdRatioBased,
            )
            from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise ConfigError(
                "tracing",
                spec.otlp_endpoint,
                f"needs OpenTelemetry: pip install 'floorguard[otel]' ({exc})",
            ) from exc
        resource = Resource.create(
            {"service.name": spec.service_name, "service.instance.id": replica}
        )
        sampler = ParentBased(
            TraceIdRatioBased(spec.sample_ratio),
            remote_parent_sampled=_client_ceiling(max(spec.sample_ratio, spec.client_sample_ratio)),
        )
        self._provider = TracerProvider(resource=resource, sampler=sampler)
        exporter = OTLPSpanExporter(
            endpoint=spec.otlp_endpoint, timeout=int(max(1, spec.export_timeout_s))
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("floorguard")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, headers: Mapping[str, str], attributes: Mapping[str, Any]) -> RequestSpan:
        """The span of a request, child of the client's trace context where it sent one."""
        from opentelemetry.trace import SpanKind  # noqa: PLC0415

        parent = self._propagator.extract(client_trace_context(headers))
        span = self._tracer.start_span(
            "floorguard.request", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return RequestSpan(span, self._propagator)

    def shutdown(self) -> None:
        """Export what is still batched (at the guard's stop)."""
        self._provider.shutdown()


def _client_ceiling(ratio: float) -> Any:
    """A sampler for a client's sampled trace: sampled with probability `ratio`, drawn here
    (OpenTelemetry's ratio sampler reads the trace id, which a client picks to pass it)."""
    from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415 (the extra)
        ALWAYS_OFF,
        ALWAYS_ON,
        Decision,
        Sampler,
        SamplingResult,
    )

    if ratio >= 1:
        return ALWAYS_ON
    if ratio <= 0:
        return ALWAYS_OFF
    draw = random.Random()

    class ClientCeiling(Sampler):
        def should_sample(self, *_: Any, trace_state: Any = None, **__: Any) -> SamplingResult:
            sampled = draw.random() < ratio
            return SamplingResult(
                Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP, trace_state=trace_state
            )

        def get_description(self) -> str:
            return f"ClientCeiling{{{ratio}}}"

    return ClientCeiling()
