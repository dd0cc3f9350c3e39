"""Issue 44's figures: how long producers stay on rows after `unilog capture wal` and after a failover (Postgres 18
primary with a synchronous standby, a streamer running, a producer committing about 200 records a second), and what
rows cost against record messages in emit time (one client, one record per transaction, no standby).

    python tools/measure_failover_hold.py [--rounds 3]

Prints one line per measurement and a JSON summary on the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from unilog import Settings, Streamer, emit
from unilog.harness.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    ReplicatedPostgres,
    embedded_postgres_bin_dir,
    probe_postgres,
)
from unilog.ops.exporter import SystemCollector
from unilog.ops.schema import migrate
from unilog.stream.modes import capture_status, enable_wal


def _produce(url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                while not stop.is_set():
                    emit(conn, action="create", object="order", data={"t": time.time()})
                    conn.commit()
                    time.sleep(0.005)
        except psycopg.Error:
            time.sleep(0.1)


def _until_messages(settings: Settings, timeout: float = 180.0) -> float:
    began = time.monotonic()
    while capture_status(settings)["records_as"] != "messages":
        if time.monotonic() - began > timeout:
            return float("nan")
        list(SystemCollector(settings).collect())  # the exporter's guard, as under Prometheus every 15 s
        time.sleep(0.5)
    return time.monotonic() - began


def _until_rows(settings: Settings, timeout: float = 30.0) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if capture_status(settings)["records_as"] == "rows":
                break
        except Exception:  # the new primary may not answer yet
            pass
        time.sleep(0.1)
    return time.monotonic() - began


def hold_durations(redis_url: str, base: Path) -> tuple[float, float]:
    """(seconds on rows after `capture wal` until the standby's copy was ready, seconds on rows after a failover
    until the old primary, rejoined right away, held a ready copy)."""
    binaries = probe_postgres(embedded_postgres_bin_dir(), "embedded-postgres")  # type: ignore[arg-type]
    with ReplicatedPostgres(base, binaries=binaries) as pair:
        migrate(pair.url)
        settings = Settings(database_url=pair.url, redis_url=redis_url, stream="measure")
        stop = threading.Event()
        producer = threading.Thread(target=_produce, args=(pair.url, stop), daemon=True)
        producer.start()
        began = time.monotonic()
        enable_wal(settings)  # no streamer runs during a switch; one starts right after it, as an operator does
        with Streamer(settings) as streamer:
            worker = threading.Thread(target=streamer.run, args=(stop,), daemon=True)
            worker.start()
            _until_messages(settings)
            after_capture = time.monotonic() - began
            began = time.monotonic()
            pair.failover()
            watch = threading.Thread(target=pair.rejoin, daemon=True)  # the old primary rejoins right away
            watch.start()
            on_rows = _until_rows(settings)  # the guard on the new primary: the old one's slot is not verified
            _until_messages(settings)
            after_failover = time.monotonic() - began - on_rows
            watch.join(60)
            stop.set()
            worker.join(30)
            producer.join(30)
        return after_capture, after_failover


def emit_cost(n: int = 2000) -> tuple[float, float]:
    """(microseconds per emit as a row, as a record message), one client, one record per transaction."""
    binaries = probe_postgres(embedded_postgres_bin_dir(), "embedded-postgres")  # type: ignore[arg-type]
    with EmbeddedPostgres(binaries=binaries, settings={"wal_level": "logical"}) as server, EmbeddedRedis() as rds:
        migrate(server.url)
        enable_wal(Settings(database_url=server.url, redis_url=rds.url))
        timings: dict[int, list[float]] = {0: [], 1: []}
        with psycopg.connect(server.url) as conn:
            for _round in range(3):
                for mode in (0, 1):
                    conn.execute("SELECT setval('unilog_emit_mode', %s)", (mode,))
                    conn.commit()
                    began = time.perf_counter()
                    for i in range(n):
                        emit(conn, action="create", object="order", data={"i": i})
                        conn.commit()
                    timings[mode].append((time.perf_counter() - began) / n * 1e6)
                    conn.execute("DELETE FROM staged_log_records")
                    conn.commit()
        return statistics.median(timings[0]), statistics.median(timings[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"after_capture_s": [], "after_failover_s": []}
    with EmbeddedRedis() as rds:
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="unilog-measure-") as tmp:
                capture, failover = hold_durations(rds.url, Path(tmp) / "pair")
            results["after_capture_s"].append(round(capture, 1))
            results["after_failover_s"].append(round(failover, 1))
            print(f"round {i + 1}: rows after capture wal {capture:.1f} s, after a failover + rejoin {failover:.1f} s")
    rows_us, messages_us = emit_cost()
    print(f"emit, one client: a row {rows_us:.0f} us, a record message {messages_us:.0f} us")
    print(json.dumps(results | {"emit_row_us": round(rows_us), "emit_message_us": round(messages_us)}))


if __name__ == "__main__":
    main()
