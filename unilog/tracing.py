"""OpenTelemetry traces from ``emit`` to the handler, when ``opentelemetry-api`` is installed (the ``tracing`` extra).

Without it nothing here imports anything and every function returns at once. With it:

* :func:`current_context` gives ``emit`` the caller's W3C trace context (``traceparent``, ``tracestate``), stored
  with the staged record; the streamer copies it into the stream entry's ``traceparent``/``tracestate`` fields.
* :func:`record_publish` records one ``send <stream>`` span (kind PRODUCER) per published batch, linked to the
  records' contexts; :func:`process_span` wraps a consumer's batch in one ``process <stream>`` span (kind CONSUMER)
  linked to each record's producer context. Attribute names follow the OpenTelemetry messaging conventions.
* :func:`context_of` turns a record's ``traceparent`` back into a context a handler can continue.

Nothing is exported unless the application configures an SDK and an exporter: the API alone records nothing.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Sequence
from typing import Any


def _installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry") is not None
    except (ImportError, ValueError):  # blocked (``sys.modules["opentelemetry"] = None``) or broken
        return False


ENABLED = _installed()
SYSTEM = "unilog"
MAX_LINKS = 128  # a batch of thousands links its first records only: spans stay small

_api: Any = None


def _otel() -> Any:
    """The OpenTelemetry modules, imported on first use (only when installed)."""
    global _api
    if _api is None:
        from opentelemetry import propagate, trace

        _api = (propagate, trace)
    return _api


def recording() -> bool:
    """Whether an OpenTelemetry SDK is configured (spans are recorded): worth work that only feeds spans."""
    if not ENABLED:
        return False
    _, trace = _otel()
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def current_context() -> tuple[str | None, str | None]:
    """(traceparent, tracestate) of the active span, or (None, None) without one (or without OpenTelemetry)."""
    if not ENABLED:
        return None, None
    propagate, trace = _otel()
    if not trace.get_current_span().get_span_context().is_valid:
        return None, None  # what inject() would find, at a fraction of its cost: every emit asks
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate") or None


def context_of(traceparent: str | None, tracestate: str | None = None) -> Any:
    """The OpenTelemetry context a ``traceparent`` (and ``tracestate``) carries, for ``tracer.start_span(context=)``;
    None without OpenTelemetry or a traceparent."""
    if not ENABLED or not traceparent:
        return None
    propagate, _ = _otel()
    carrier = {"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})}
    return propagate.extract(carrier)


def _links(traceparents: Sequence[str | None]) -> list[Any]:
    _, trace = _otel()
    links: list[Any] = []
    for traceparent in traceparents:
        if traceparent and len(links) < MAX_LINKS:
            span_context = trace.get_current_span(context_of(traceparent)).get_span_context()
            if span_context.is_valid:
                links.append(trace.Link(span_context))
    return links


def record_publish(stream: str, count: int, traceparents: Sequence[str], start_ns: int, end_ns: int) -> None:
    """One ``send <stream>`` span for a published batch (Redis confirmed it, the staged rows are deleted)."""
    if not ENABLED:
        return
    _, trace = _otel()
    span = trace.get_tracer("unilog").start_span(
        f"send {stream}",
        kind=trace.SpanKind.PRODUCER,
        links=_links(traceparents),
        start_time=start_ns,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.destination.name": stream,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.batch.message_count": count,
        },
    )
    span.end(end_time=end_ns)


@contextlib.contextmanager
def process_span(
    stream: str, consumer: str, records: Sequence[Any], *, group: bool = False, kind: str | None = None
) -> Iterator[None]:
    """A ``process <stream>`` span around a consumer's batch, linked to each record's producer context.

    ``records`` are the batch's records (the Spark sink passes only those with a trace context, and its ``kind``)."""
    if not ENABLED or not (records or kind):
        yield
        return
    _, trace = _otel()
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": stream,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.consumer.group.name": consumer,
        "unilog.consumer.kind": kind or ("group" if group else "checkpoint"),
    }
    if kind is None:
        attributes["messaging.batch.message_count"] = len(records)
    if len(records) == 1:
        attributes["messaging.message.id"] = records[0].id
    links = _links([r.traceparent for r in records])
    with trace.get_tracer("unilog").start_as_current_span(
        f"process {stream}", kind=trace.SpanKind.CONSUMER, links=links, attributes=attributes
    ):
        yield
