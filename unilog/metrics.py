"""Prometheus metrics of unilog's own processes, defined in this one place.

Every long-running process (streamer, checkpoint consumer, group and partition worker, the Spark consumer's driver)
updates these as it works and serves them with :func:`serve` when given ``--metrics-port``. Names follow the
Prometheus conventions: base units, ``_total`` counters, ``_seconds`` histograms. Label values are bounded: stream
names, consumer and group names, process kinds, fault points, exception class names; never ids or payloads.

Counters are updated once per batch, never per record, so the cost stays a few microseconds per batch. The whole
system's state (lag, backlog, open transactions that staged) is exported by ``unilog metrics``
(:mod:`unilog.ops.exporter`) instead, since no single process knows it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Info, make_wsgi_app

from . import health
from .config import DISTRIBUTION

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_SIZE_BUCKETS = (1, 10, 50, 100, 500, 1000, 5000, 10000, 50000)

INFO = Info("unilog", "The unilog version of this process")
try:
    INFO.info({"version": version(DISTRIBUTION)})
except PackageNotFoundError:  # running from a source tree that was never installed
    INFO.info({"version": "unknown"})

RECORDS_PUBLISHED = Counter(
    "unilog_records_published",
    "Records the streamer published: Redis confirmed them and their staged rows are gone",
    ["stream"],
)
RECORDS_CONSUMED = Counter(
    "unilog_records_consumed", "Records handed to a handler in a batch that committed", ["stream", "consumer", "kind"]
)
RECORDS_SKIPPED = Counter(
    "unilog_records_skipped",
    "Entries read and not handed to the handler: duplicates, or another consumer's replays",
    ["stream", "consumer", "kind"],
)
BATCH_RECORDS = Histogram(
    "unilog_batch_records", "Records per committed batch", ["process", "stream"], buckets=_SIZE_BUCKETS
)
BATCH_SECONDS = Histogram(
    "unilog_batch_duration_seconds",
    "Time from reading a batch to its commit (the streamer: fetch, send, delete)",
    ["process", "stream"],
    buckets=_LATENCY_BUCKETS,
)
PUBLISH_LATENCY = Histogram(
    "unilog_publish_latency_seconds",
    "From staging (the producer's insert) to publication (the delete's commit), of the oldest record of each batch",
    ["stream"],
    buckets=_LATENCY_BUCKETS,
)
APPLY_LATENCY = Histogram(
    "unilog_apply_latency_seconds",
    "From publication (the entry's id time) to the commit that applied it, of the oldest record of each batch",
    ["stream", "consumer", "kind"],
    buckets=_LATENCY_BUCKETS,
)
RETRIES = Counter("unilog_retries", "Failed passes that will be retried, by cause", ["process", "cause"])
BACKOFF_SECONDS = Counter("unilog_backoff_seconds", "Time spent backing off after failed passes", ["process"])
RESTARTS = Counter("unilog_restarts", "In-process restarts after an injected crash", ["process"])
ERRORS = Counter("unilog_errors", "Failed passes and stops, by exception class", ["process", "kind"])
FAULTS_INJECTED = Counter("unilog_faults_injected", "Faults injected, by point", ["point"])
DEAD_LETTERS = Counter(
    "unilog_dead_lettered_records",
    "Records moved to the dead letters, by reason (malformed, poison, max_deliveries)",
    ["stream", "consumer", "reason"],
)
LETTERS_UNREPLICATED = Counter(
    "unilog_dead_letters_unreplicated",
    "Dead letters too few replicas acknowledged in time (wait_replicas): a checkpoint consumer kept the record and "
    "retries it; a group's letter stands or falls with its acknowledgement",
    ["stream", "consumer"],
)
STREAM_LOCK = Gauge("unilog_stream_lock_held", "1 while this streamer holds the stream's publishing lock", ["stream"])
REDIS_MEMORY_RATIO = Gauge(
    "unilog_redis_memory_ratio", "Redis's used_memory / maxmemory as the streamer last read it (0: no maxmemory)"
)
STREAMER_PAUSED = Gauge(
    "unilog_streamer_paused",
    "1 while the streamer holds off publishing, by cause (redis_memory)",
    ["streamer", "reason"],
)
BACKFILL_ROWS = Counter(
    "unilog_backfill_rows", "Rows a backfill staged a record for, in pages that committed", ["backfill"]
)
BACKFILL_ESTIMATE = Gauge(
    "unilog_backfill_rows_estimate", "The rows a running backfill expects to stage in all (its estimate)", ["backfill"]
)
BACKFILL_RUNNING = Gauge("unilog_backfill_running", "1 while this process runs the backfill", ["backfill"])
BACKFILL_PAGE_SECONDS = Histogram(
    "unilog_backfill_page_duration_seconds",
    "A backfill page's transaction: waiting out older transactions, reading and locking its rows, staging, commit",
    ["backfill"],
    buckets=_LATENCY_BUCKETS,
)

_served: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve this process's metrics on ``http://addr:port/metrics``, and its ``/healthz`` and ``/readyz``
    (:mod:`unilog.health`), from a daemon thread (once per address)."""
    with _lock:
        if (addr, port) not in _served:
            _served[(addr, port)] = _start(port, addr)


def _start(port: int, addr: str) -> Any:
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    metrics_app = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        answer = health.respond(environ.get("PATH_INFO", ""))
        if answer is None:
            return list(metrics_app(environ, start_response))
        status, body = answer
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response("200 OK" if status == 200 else "503 Service Unavailable", headers)
        return [body]

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:  # a probe every few seconds is not news
            pass

    server = make_server(addr, port, app, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True, name="unilog-metrics").start()
    return server


# A streamer's series per stream are bounded: the first STREAM_SERIES streams this process publishes get their own,
# the rest share stream="*" (SEVERAL), which also labels a batch across several streams. Over 10,000 streams a
# series each was 20,000 series a scrape and 20,000 labels() calls (about 0.9 s) in a fresh process's first pass
SEVERAL = "*"
STREAM_SERIES = 100


class _StreamChildren:
    """A metric's child per stream, the first :data:`STREAM_SERIES` streams their own, the rest the shared one."""

    def __init__(self, metric: Any, *prefix: str) -> None:
        self.metric = metric
        self.prefix = prefix
        self.children: dict[str, Any] = {}
        self.own = 0

    def __call__(self, stream: str) -> Any:
        child = self.children.get(stream)
        if child is None:
            if self.own < STREAM_SERIES or stream == SEVERAL:
                child = self.metric.labels(*self.prefix, stream)
                self.own += stream != SEVERAL
            else:
                child = self(SEVERAL)
            self.children[stream] = child
        return child

    def own_series(self, stream: str) -> bool:
        """True if ``stream`` has (or would get) a series of its own."""
        return self(stream) is not self(SEVERAL) or stream == SEVERAL


_published = _StreamChildren(RECORDS_PUBLISHED)
_batch_records = _StreamChildren(BATCH_RECORDS, "streamer")
_batch_seconds = _StreamChildren(BATCH_SECONDS, "streamer")
_publish_latency = _StreamChildren(PUBLISH_LATENCY)
_locks = _StreamChildren(STREAM_LOCK)
_locks_past: set[str] = set()  # streams past the bound whose lock this process holds: the shared gauge counts them


def batch_published(stream: str, count: int, seconds: float, first_created_ms: int | None) -> None:
    """The streamer committed the delete of a batch Redis confirmed."""
    spread_published({stream: count}, seconds, first_created_ms)


def locks_held(streams: Iterable[str], held: bool) -> None:
    """The streamer took (``held``) or let go of the publishing lock of each of ``streams``: 1 or 0 for a stream
    with a series of its own, and for the rest ``stream="*"`` counts those held."""
    value = 1 if held else 0
    past = len(_locks_past)
    shared, children = _locks(SEVERAL), _locks.children
    for stream in streams:
        # own_series() inlined: two calls a stream were 30 ms of a first pass over ten thousand streams
        child = children.get(stream) or _locks(stream)
        if child is not shared or stream == SEVERAL:
            child.set(value)
        elif held:
            _locks_past.add(stream)
        else:
            _locks_past.discard(stream)
    if len(_locks_past) != past:
        _locks(SEVERAL).set(len(_locks_past))


def spread_published(records: dict[str, int], seconds: float, first_created_ms: int | None) -> None:
    """The streamer committed the delete of a batch across streams, ``records`` per stream: each stream's records
    counted, the batch observed once (under its stream's name if it had one, else :data:`SEVERAL`)."""
    # streams past the bound share one child: one increment of their sum (an increment takes a lock; one per stream
    # was 0.28 s of a WAL-mode drain of 50,000 records over 10,000 streams)
    counts: dict[int, list[Any]] = {}
    for stream, count in records.items():
        child = _published(stream)
        entry = counts.get(id(child))
        if entry is None:
            counts[id(child)] = [child, count]
        else:
            entry[1] += count
    for child, total in counts.values():
        child.inc(total)
    label = next(iter(records)) if len(records) == 1 else SEVERAL
    _batch_records(label).observe(sum(records.values()))
    _batch_seconds(label).observe(seconds)
    if first_created_ms is not None:
        _publish_latency(label).observe(max(0.0, time.time() - first_created_ms / 1000))


def batch_consumed(
    kind: str, stream: str, consumer: str, *, handled: int, skipped: int, seconds: float, first_id: bytes | None
) -> None:
    """A consumer (``kind`` checkpoint, group, partition or spark) committed a batch whose first entry is
    ``first_id`` (None: unknown, no latency observed)."""
    RECORDS_CONSUMED.labels(stream, consumer, kind).inc(handled)
    if skipped:
        RECORDS_SKIPPED.labels(stream, consumer, kind).inc(skipped)
    BATCH_RECORDS.labels(kind, stream).observe(handled + skipped)
    BATCH_SECONDS.labels(kind, stream).observe(seconds)
    if first_id is None:
        return
    published_ms = int(first_id.split(b"-", 1)[0])
    APPLY_LATENCY.labels(stream, consumer, kind).observe(max(0.0, time.time() - published_ms / 1000))


def dead_lettered(stream: str, consumer: str, reason: str) -> None:
    DEAD_LETTERS.labels(stream, consumer, reason).inc()


def letter_unreplicated(stream: str, consumer: str) -> None:
    LETTERS_UNREPLICATED.labels(stream, consumer).inc()
