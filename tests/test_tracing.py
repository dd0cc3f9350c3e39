"""Traces: one ride followed from the API request's span, through the streamer's send span, to the consumer's process
span and a handler's own span, with the SDK's in-memory exporter. And without OpenTelemetry, nothing is imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from unilog import Consumer, ConsumerConfig, GroupConfig, GroupConsumer, Record, Settings, Streamer, emit


def test_one_ride_is_traced_from_the_request_to_the_handler(
    settings: Settings, rds: Any, spans: InMemorySpanExporter
) -> None:
    from unilog_demo.api import create_app
    from unilog_demo.migrate import prepare
    from unilog_demo.rides import STREAM

    prepare(settings.database_url)
    client = create_app(settings.database_url).test_client()
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # an upstream service's context
    assert client.post("/rides", json={"distance": 12.5}, headers={"traceparent": caller}).status_code == 201
    with Streamer(Settings.from_dsn(settings.database_url, settings.redis_url, STREAM)) as streamer:
        streamer.drain()
    ((entry_id, fields),) = rds.xrange(STREAM)
    request = next(s for s in spans.get_finished_spans() if s.name == "POST /rides")
    trace_id = request.context.trace_id
    assert trace_id == 0x0AF7651916CD43DD8448EB211C80319C, "the request continued its caller's trace"
    assert fields["traceparent"] == f"00-{trace_id:032x}-{request.context.span_id:016x}-01"

    tracer = trace.get_tracer("test")

    def handler(conn: psycopg.Connection[Any], records: Sequence[Record]) -> None:
        for record in records:  # a handler continues the producer's trace
            with tracer.start_as_current_span("apply ride", context=record.trace_context()):
                pass

    with Consumer(settings, ConsumerConfig(name="traced", stream=STREAM), handler) as consumer:
        consumer.drain()
    with GroupConsumer(settings, GroupConfig(group="g", stream=STREAM), handler) as group:
        group.drain()
    by_name: dict[str, list[Any]] = {}
    for span in spans.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    (send,) = by_name[f"send {STREAM}"]
    assert send.kind is trace.SpanKind.PRODUCER and [link.context.trace_id for link in send.links] == [trace_id]
    assert send.attributes["messaging.destination.name"] == STREAM and send.attributes["messaging.system"] == "unilog"
    processes = by_name[f"process {STREAM}"]
    assert len(processes) == 2, "the checkpoint consumer's and the group's"
    for process in processes:
        assert process.kind is trace.SpanKind.CONSUMER
        assert [link.context.span_id for link in process.links] == [request.context.span_id]
        assert process.attributes["messaging.operation.type"] == "process"
        assert process.attributes["messaging.message.id"] == entry_id
        assert process.attributes["messaging.batch.message_count"] == 1
    assert {p.attributes["messaging.consumer.group.name"] for p in processes} == {"traced", "g"}
    applied = by_name["apply ride"]
    assert len(applied) == 2 and all(s.context.trace_id == trace_id for s in applied), "same trace as the request"
    assert all(s.parent.span_id == request.context.span_id for s in applied)


def test_a_record_staged_outside_any_span_carries_no_context(
    settings: Settings, pg: Any, rds: Any, spans: InMemorySpanExporter
) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        emit(conn, action="create", object="ride", data={"n": 1})
    assert pg.execute("SELECT traceparent, tracestate FROM staged_log_records").fetchall() == [(None, None)]
    with Streamer(settings) as streamer:
        streamer.drain()
    ((_, fields),) = rds.xrange(settings.stream)
    assert "traceparent" not in fields and "tracestate" not in fields
    assert [s.name for s in spans.get_finished_spans()] == [f"send {settings.stream}"]
    assert spans.get_finished_spans()[0].links == ()


def test_without_opentelemetry_nothing_is_imported(settings: Settings) -> None:
    """With opentelemetry missing (a finder that reports it not found, as Python does for a package not installed),
    emit and the tracing helpers work and nothing imports it: every ``import`` of it is recorded (the one
    ``find_spec`` probe that decides ``ENABLED`` is not an import). The recorder is checked to see an import."""
    code = """
import builtins, importlib, sys

class NotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled)
attempts = []
real_import, real_import_module = builtins.__import__, importlib.import_module

def recording_import(name, *args, **kwargs):
    if name.partition(".")[0] == "opentelemetry":
        attempts.append(name)
    return real_import(name, *args, **kwargs)

def recording_import_module(name, package=None):
    if name.partition(".")[0] == "opentelemetry":
        attempts.append(name)
    return real_import_module(name, package)

builtins.__import__, importlib.import_module = recording_import, recording_import_module
import psycopg, unilog
from unilog import tracing
assert not tracing.ENABLED
with psycopg.connect(sys.argv[1]) as conn:
    unilog.emit(conn, action="create", object="ride", data={"n": 1})
assert tracing.current_context() == (None, None) and not tracing.recording()
assert tracing.context_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01") is None
assert attempts == [], f"imported: {attempts}"
assert not [m for m in sys.modules if m.partition(".")[0] == "opentelemetry"], "imported"
try:  # the positive control: an import of it is seen
    import opentelemetry.trace
except ModuleNotFoundError:
    pass
assert attempts == ["opentelemetry.trace"], attempts
"""
    result = subprocess.run([sys.executable, "-c", code, settings.conninfo], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_mixed_batch_carries_each_records_own_context(settings: Settings, rds: Any, spans: Any) -> None:
    """Traced and untraced records, with and without a key and a tracestate, in one batch: each entry gets exactly
    its own fields (the seven-argument publish path and its table fallback)."""
    from opentelemetry import context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    parent = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1")])
    )
    tracer = trace.get_tracer("test")
    with psycopg.connect(settings.conninfo) as conn:
        with tracer.start_as_current_span("keyed"):
            emit(conn, action="a", object="o", data={"n": 1}, key="k1")
        emit(conn, action="a", object="o", data={"n": 2})
        with tracer.start_as_current_span("plain"):
            emit(conn, action="a", object="o", data={"n": 3})
        token = context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
        try:
            emit(conn, action="a", object="o", data={"n": 4}, key="k4")
        finally:
            context.detach(token)
    with Streamer(settings) as streamer:
        streamer.drain()
    entries = [fields for _, fields in rds.xrange(settings.stream)]
    assert [sorted(set(f) - {"data", "action", "object", "producer", "epoch", "seq", "created"}) for f in entries] == [
        ["key", "traceparent"],
        [],
        ["traceparent"],
        ["key", "traceparent", "tracestate"],
    ]
    assert entries[0]["key"] == "k1" and entries[3]["tracestate"] == "vendor=v1"
    assert entries[3]["traceparent"] == f"00-{0xABC:032x}-{0xDEF:016x}-01"
    (send,) = [s for s in spans.get_finished_spans() if s.name.startswith("send")]
    assert len(send.links) == 3
