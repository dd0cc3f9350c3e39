"""``unilog metrics``: the whole system's state as Prometheus metrics, read from Postgres and Redis at each scrape.

No single process knows a consumer's lag or the staged backlog; this exporter reads them the way ``unilog status``
does (:func:`unilog.ops.status.collect_status`), once per scrape, so what it reports is always current and it keeps no
state. Run one per system, next to the processes' own ``--metrics-port`` metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import engine, store
from ..config import Settings
from ..errors import UnilogError
from ..health import HEALTH
from ..runtime.policy import transient
from .scale import worst

log = structlog.get_logger(__name__)

# Streams given labelled series (the worst, as `unilog status` ranks them): Prometheus keeps a series per label set, so
# 10,000 streams would be some 150,000 series a scrape; the totals cover the rest, and the worst stream's lag, which
# the alerts watch, is always among those labelled.
MAX_STREAMS = 100


class SystemCollector(Collector):
    """Collects the system-wide gauges; a scrape that cannot reach a server (unreachable, restarting, ending the
    session, a cluster failing over) reports ``unilog_system_up 0``, logs one line and makes ``/readyz`` fail until
    a scrape reads both servers again: the exporter lives on, at start too (registering it scrapes once)."""

    def __init__(self, settings: Settings, max_streams: int | None = MAX_STREAMS) -> None:
        self.settings = settings
        self.max_streams = max_streams

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from .status import collect_status

        started = time.perf_counter()
        try:
            _guard(self.settings)
            report = collect_status(self.settings)
        except Exception as exc:
            if not isinstance(exc, UnilogError) and not transient(exc):
                raise
            error = " ".join(str(exc).split()) or type(exc).__name__
            log.error("scrape failed", error=error)
            HEALTH.unready("exporter", error)
            yield _gauge("unilog_system_up", "1 if the last scrape read Postgres and Redis", [], [([], 0)])
            return
        HEALTH.reached("exporter")
        yield _gauge("unilog_system_up", "1 if the last scrape read Postgres and Redis", [], [([], 1)])
        shown = worst(report, self.max_streams)
        yield from _families(shown)
        yield from _totals_families(shown)
        yield _gauge(
            "unilog_scrape_duration_seconds",
            "How long reading the system took",
            [],
            [([], time.perf_counter() - started)],
        )


def _guard(settings: Settings) -> None:
    """Each scrape checks the WAL capture slot as a streamer does (:mod:`unilog.stream.guard`): while no streamer
    runs, the exporter is the process that holds producers to rows before the slot can be lost."""
    from ..stream.guard import guard

    try:
        with store.connect(settings.conninfo, application_name="unilog-metrics") as conn:
            guard(
                conn,
                streaming=False,
                in_doubt=lambda: _in_doubt(settings, conn),
                conninfos=settings.standby_conninfos,
            )
    except (UnilogError, psycopg.Error, engine.RedisError, OSError) as exc:
        error = " ".join(str(exc).split())
        if error not in _GUARD_ERRORS:  # once per cause: a scrape every 15 s would repeat it all day
            _GUARD_ERRORS.add(error)
            log.warning("the capture slot's guard could not run", error=error)


_GUARD_ERRORS: set[str] = set()


def _in_doubt(settings: Settings, conn: Any) -> bool:
    """Whether a batch was sent to Redis and not yet saved in Postgres, or a table-mode claim is pending (the
    rescue would make a second record of it)."""
    from ..stream.publisher import unsaved_batches

    identity, positions = store.producer_identity(conn), store.published_positions(conn)
    claimed = store.any_pending_claims(conn)
    conn.commit()
    client = engine.connect(settings.redis_url)
    try:
        return bool(claimed) or bool(unsaved_batches(engine.RedisStreams(client), identity, positions))
    finally:
        client.close()


def _gauge(name: str, doc: str, labels: list[str], samples: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _id_seconds(entry_id: str | None) -> float | None:
    return None if not entry_id else int(entry_id.partition("-")[0]) / 1000


def _families(report: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    staged, streams = report["staged"], report["streams"]
    holder = staged.get("open_stager")
    yield _gauge(
        "unilog_open_staging_transaction_seconds",
        "Age of the oldest open transaction that staged records, which wait for its commit (0 if none)",
        [],
        [([], float(holder["age_seconds"]) if holder else 0.0)],
    )
    yield _gauge(
        "unilog_stream_length", "Entries in the stream", ["stream"], [([s["name"]], s["length"]) for s in streams]
    )
    for edge in ("first", "last"):
        yield _gauge(
            f"unilog_stream_{edge}_entry_timestamp_seconds",
            f"When the stream's {edge} entry was appended (its id's time)",
            ["stream"],
            [([s["name"]], t) for s in streams if (t := _id_seconds(s[f"{edge}_id"])) is not None],
        )
    yield _gauge(
        "unilog_staged_records",
        "Records staged, not yet published",
        ["stream"],
        [([s["name"]], s["staged"]) for s in streams],
    )
    yield _gauge(
        "unilog_staged_oldest_age_seconds",
        "Age of the oldest staged record (absent when none is staged)",
        ["stream"],
        [([s["name"]], s["staged_oldest_age_seconds"]) for s in streams if s["staged_oldest_age_seconds"] is not None],
    )
    yield _gauge(
        "unilog_dead_letters",
        "Dead letters waiting (replay or drop them)",
        ["stream"],
        [([s["name"]], s["dead_letters"]) for s in streams],
    )
    yield _gauge(
        "unilog_stream_publishers",
        "Streamers holding the stream's publishing lock (0: nobody publishes it)",
        ["stream"],
        [([s["name"]], s["publishers"]) for s in streams if s["publishers"] is not None],
    )
    yield from _lag_families(report)
    yield from _capture_families(report.get("capture") or {"mode": "table"})


def _totals_families(report: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    """Every stream counted, labelled or not; and how many streams and consumers have no labelled series of their
    own (more streams than ``unilog metrics --max-streams``)."""
    t, omitted = report["totals"], report["omitted"]
    yield _gauge(
        "unilog_streams", "Streams in the system (with entries, staged records or a consumer)", [], [([], t["streams"])]
    )
    yield _gauge(
        "unilog_staged_records_total",
        "Records staged over every stream, not yet published",
        [],
        [([], t["staged"])],
    )
    yield _gauge(
        "unilog_consumer_lag_entries_total",
        "Entries behind, summed over every consumer and group",
        [],
        [([], t["lag_entries"])],
    )
    yield _gauge(
        "unilog_consumer_lag_seconds_max", "The longest wait of any consumer or group", [], [([], t["max_lag_seconds"])]
    )
    yield _gauge(
        "unilog_series_omitted",
        "Streams and consumers without labelled series of their own (beyond --max-streams, the worst kept)",
        ["kind"],
        [(["streams"], omitted["streams"]), (["consumers"], omitted["consumers"])],
    )


def _registration_families(consumers: list[dict[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """Each consumer registered for retention (label ``stream``, ``consumer``), whether or not it ever ran."""
    registered = [([c["stream"], c["name"]], c) for c in consumers if c.get("registered_id") is not None]
    labels = ["stream", "consumer"]
    yield _gauge(
        "unilog_consumer_registered_never_ran",
        "1 for a consumer registered for retention that has no checkpoint yet (it never ran), 0 once it has one",
        labels,
        [(values, 1 if c["never_ran"] else 0) for values, c in registered],
    )
    yield _gauge(
        "unilog_consumer_held_entries",
        "Entries retention keeps for a registered consumer: after its registered id, up to the last one the next "
        "holder further along the stream has read (0: it holds nothing)",
        labels,
        [(values, c["holds_entries"]) for values, c in registered],
    )
    yield _gauge(
        "unilog_consumer_registration_age_seconds",
        "How long the first entry after a consumer's registered id has waited (0 when none follows it): grows while "
        "the registration does not move past it",
        labels,
        [(values, c["registration_age_seconds"] or 0.0) for values, c in registered],
    )


def _lag_families(report: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    yield from _registration_families(report["consumers"])
    # a consumer registered ahead of its first run lags by the whole retained stream (its lag after 0-0)
    rows = [([c["stream"], c["name"], "checkpoint"], c) for c in report["consumers"]]
    rows += [([s["name"], g["name"], "group"], g) for s in report["streams"] for g in s["groups"]]
    labels = ["stream", "consumer", "kind"]
    yield _gauge(
        "unilog_consumer_lag_entries",
        "Entries after the consumer's checkpoint (a group's last delivered; a registered consumer's id until it runs)",
        labels,
        [(values, row["lag_entries"]) for values, row in rows],
    )
    yield _gauge(
        "unilog_consumer_lag_seconds",
        "How long the oldest entry not yet consumed has waited",
        labels,
        [(values, row["lag_seconds"]) for values, row in rows],
    )
    groups = [([s["name"], g["name"]], g) for s in report["streams"] for g in s["groups"]]
    yield _gauge(
        "unilog_group_pending_entries",
        "Entries delivered to a group's workers and not acknowledged",
        ["stream", "group"],
        [(values, g["pending"]) for values, g in groups],
    )
    yield _gauge(
        "unilog_group_workers",
        "Workers a group knows",
        ["stream", "group"],
        [(values, g["workers"]) for values, g in groups],
    )
    yield _gauge(
        "unilog_group_dead_letters",
        "Dead letters of a group",
        ["stream", "group"],
        [(values, g["dead_letters"]) for values, g in groups],
    )


# The WAL capture gauges read off the status report: (name, its key there, help)
_CAPTURE_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "unilog_capture_slot_failover",
        "failover",
        "1 if the WAL capture slot is a failover slot (Postgres 17+: standbys with sync_replication_slots copy it)",
    ),
    (
        "unilog_capture_slot_copies_ready",
        "copies_ready",
        "Standbys among DATABASE_URL's hosts whose copy of the failover slot is ready to take over (synced, not "
        "temporary, not invalidated); no sample without a failover slot",
    ),
    (
        "unilog_capture_failover_ready",
        "failover_ready",
        "1 if every standby of the primary holds a copy of the failover slot that survives a promotion, verified "
        "on the standbys (DATABASE_URL's hosts, UNILOG_STANDBY_URLS); 0 while one does not or cannot be verified "
        "(producers are held to rows meanwhile: nothing is lost); 1 with no standby",
    ),
    (
        "unilog_capture_decoding_held_back",
        "held_back",
        "1 while synchronized_standby_slots names a physical slot that is missing or inactive: Postgres holds "
        "logical decoding back and the streamer receives nothing",
    ),
    (
        "unilog_capture_losses_unacknowledged",
        "losses_unacknowledged",
        "Lost capture slots whose record messages could not all be recovered from the WAL, not acknowledged yet "
        "(`unilog capture losses`)",
    ),
    (
        "unilog_capture_records_held",
        "held_reason",
        "1 while producers are held to rows because the slot is at risk (a standby without failover slots, or "
        "max_slot_wal_keep_size near): nothing is lost, record messages resume when it has passed",
    ),
    (
        "unilog_capture_slot_retained_bytes",
        "retained_bytes",
        "WAL the server keeps for the slot: current WAL position - restart_lsn",
    ),
    (
        "unilog_capture_slot_confirmed_lag_bytes",
        "confirmed_lag_bytes",
        "WAL not yet confirmed by the slot's streamer: current WAL position - confirmed_flush_lsn",
    ),
)


def _capture_families(capture: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    """WAL capture's slot (label ``slot``); no samples in table mode, which has no slot."""
    wal = capture["mode"] == "wal"
    labels = [capture["slot"]] if wal else []
    yield _gauge(
        "unilog_capture_slot_active",
        "1 while a streamer streams from the WAL capture slot, 0 while none does (the slot retains WAL meanwhile)",
        ["slot"],
        [(labels, 1 if capture["active"] else 0)] if wal else [],
    )
    for name, key, doc in _CAPTURE_GAUGES:
        value = capture.get(key) if wal else None
        if (key in ("failover", "held_reason", "held_back") and wal) or (key == "failover_ready" and value is not None):
            value = 1 if value else 0
        yield _gauge(name, doc, ["slot"], [] if value is None else [(labels, value)])
