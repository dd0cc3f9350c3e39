"""``python -m bench.memprobe dashboard|exporter [--rounds N]``: the dashboard's or the exporter's work of a long run
done in a tight loop in one process, against throw-away servers with a few streams and consumers and a record
staged every tenth round, printing the process's RSS and the Python heap (``tracemalloc``) every ``--every`` rounds.

A two-hour soak read small second-hour RSS slopes in both processes (dashboard +0.66 MB/h, exporter +0.32 MB/h:
bench/RESULTS.md, issue 47 item 7), too small to tell a leak from an allocator still spreading in two hours. Here a
dashboard round is one sample of its history and one ``/api/status`` request (about 1,800 of each an hour at the
default 2 s interval), an exporter round one scrape (``generate_latest``; 240 an hour at a 15 s scrape interval), so
a few thousand rounds are hours of either. A heap or RSS that still climbs after the first thousand rounds is a leak
in that work."""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import psycopg

from unilog import Consumer, ConsumerConfig, Settings, Streamer, emit
from unilog.harness.embedded import EmbeddedPostgres, EmbeddedRedis
from unilog.ops.schema import migrate

STREAMS = ("rides", "payments", "shipments")


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def populate(settings: Settings) -> None:
    """50 records on each stream, published, and two consumers caught up on two of them."""
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(50):
            for stream in STREAMS:
                emit(conn, action="noted", object="item", data={"i": i}, stream=stream)
        conn.commit()
    Streamer(settings).drain()
    for name, stream in (("probe-a", STREAMS[0]), ("probe-b", STREAMS[1])):
        with Consumer(settings.with_(stream=stream), ConsumerConfig(name=name), lambda conn, batch: None) as consumer:
            consumer.drain()


def dashboard_round(settings: Settings) -> Callable[[], None]:
    from unilog.ops.dashboard import create_app
    from unilog.ops.dashboard.history import History

    history = History(settings, interval=0.0, seconds=20.0)  # a short window: the history is full from early on
    client = create_app(settings, history, read_only=True).test_client()

    def one() -> None:
        history.sample()
        assert client.get("/api/status").status_code == 200

    return one


def exporter_round(settings: Settings) -> Callable[[], None]:
    from prometheus_client import CollectorRegistry, generate_latest

    from unilog.ops.exporter import SystemCollector

    registry = CollectorRegistry()
    registry.register(SystemCollector(settings))

    def one() -> None:
        assert b"unilog_system_up 1.0" in generate_latest(registry)

    return one


def probe(kind: str, rounds: int, every: int) -> None:
    with EmbeddedPostgres() as pg, EmbeddedRedis() as rd:
        migrate(pg.url)
        settings = Settings(database_url=pg.url, redis_url=rd.url, stream=STREAMS[0])
        populate(settings)
        one = {"dashboard": dashboard_round, "exporter": exporter_round}[kind](settings)
        tracemalloc.start(1)
        started = time.monotonic()
        with psycopg.connect(settings.conninfo, autocommit=True) as producer:
            for n in range(1, rounds + 1):
                one()
                if n % 10 == 0:  # the streams move: rates and lags change between rounds
                    with producer.transaction():
                        emit(producer, action="noted", object="item", data={"n": n}, stream=STREAMS[0])
                if n % every == 0:
                    gc.collect()
                    heap = tracemalloc.get_traced_memory()[0] / 1e6
                    elapsed = time.monotonic() - started
                    print(f"{kind}: {n} rounds, {elapsed:.0f} s: RSS {rss_mb():.1f} MB, Python heap {heap:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memprobe", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("dashboard", "exporter"))
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500)
    args = parser.parse_args()
    probe(args.kind, args.rounds, args.every)


if __name__ == "__main__":
    main()
