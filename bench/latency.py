"""``latency``: commit-to-handler latency at a steady producer rate, unilog against the reference's polling loops.

Three processes besides the coordinator: a producer (2 threads, one connection each, an open-loop schedule of
``rate`` single-record transactions per second), the streamer and the consumer. Record ``i`` carries ``i`` in its
payload; the producer writes ``t0[i] = time.monotonic()`` into shared memory right *before* ``COMMIT``, and the
consumer's handler writes ``lat[i] = time.monotonic() - t0[i]`` when it first sees the record (CLOCK_MONOTONIC is
one clock for every process on the host). Two splits show where the time goes: the ``COMMIT`` itself, and commit
start to the ``XADD`` (from the stream entry id's millisecond, so +-1 ms; also from the commit's end, its fsync
left out); the rest is Redis to the handler. For unilog the ``XADD`` is also bracketed to the microsecond: the
streamer process notes when it called Redis with each position and when Redis confirmed it (after its AOF fsync),
and the handler notes each record's position, so "to publish call" and "to Redis confirmed" enclose the ``XADD``.

* ``unilog``: ``Streamer.run`` (LISTEN/NOTIFY wake-up) and ``Consumer.run`` (blocking ``XREAD``), defaults; records
  staged with ``unilog.emit``.
* ``unilog-wal``: the same in WAL capture mode (``unilog capture wal``): ``emit`` writes logical messages, the
  streamer reads them from the slot as they commit.
* ``reference``: the ports in :mod:`bench.reference` run as the reference runs them: each loop passes again at once
  after a pass that did something and sleeps 5 s after one that found nothing; records staged with the reference's
  raw ``INSERT``. Its consumer skips a ride whose id is not above the last one it consumed, so a transaction that
  commits after a later one is never consumed: those show as ``missing``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from unilog import Consumer, ConsumerConfig, Streamer, emit
from unilog.stream.modes import disable_wal, enable_wal

from .core import SPAWN, Profile, Results, interleaved, log, percentile, worker_init
from .env import BenchEnv, Urls
from .reference import ReferenceConsumer, ReferenceStreamer

PRODUCER_THREADS = 2
REF_STREAM = "ref-latency"
RAW_INSERT = "INSERT INTO staged_log_records (action, object, data) VALUES ('create', 'ride', %s::jsonb)"
SETTLE_TIMEOUT = 30.0  # after the producer stops: how long to wait for the last records
STALL_TIMEOUT = 12.0  # ... or for progress to resume (the reference sleeps up to 2 x 5 s)
CHECKPOINT_UNILOG = "SELECT last_id FROM unilog_checkpoints WHERE name = 'bench-latency'"
CHECKPOINT_REF = "SELECT last_redis_id FROM ref_checkpoints WHERE name = 'bench-latency'"


@dataclass(frozen=True)
class Probes:
    """Shared memory, one slot per record (0.0: not yet). Monotonic clock for the latency itself; the wall clock
    only to place the ``XADD`` (the stream entry id is Redis's wall-clock millisecond, so that split is +-1 ms)."""

    t0: Any  # monotonic, just before COMMIT
    committed: Any  # monotonic, when COMMIT returned
    wall: Any  # time.time(), just before COMMIT
    latency: Any  # seconds from t0 to the consumer's handler
    to_xadd: Any  # seconds from wall to the entry id's millisecond
    seen: Any  # records seen by the handler
    seq: Any = None  # record i's position (unilog's consumer only; 0: not seen)
    called: Any = None  # by position: monotonic, when the streamer called Redis with it
    confirmed: Any = None  # by position: monotonic, when Redis confirmed it

    @staticmethod
    def create(n: int) -> Probes:
        t0, committed, wall, latency, to_xadd = (SPAWN.Array("d", n, lock=False) for _ in range(5))
        seq = SPAWN.Array("l", n, lock=False)
        called, confirmed = (SPAWN.Array("d", n + 1, lock=False) for _ in range(2))
        return Probes(t0, committed, wall, latency, to_xadd, SPAWN.Value("l", 0, lock=False), seq, called, confirmed)


_PROBES: Probes | None = None  # the consumer process's probes, set before its handler runs


def _probe(i: int, entry_id: str) -> None:
    """Record the latency of record ``i`` the first time the consumer's handler sees it."""
    p = _PROBES
    assert p is not None
    if p.latency[i] == 0.0:
        p.latency[i] = time.monotonic() - p.t0[i]
        p.to_xadd[i] = int(entry_id.partition("-")[0]) / 1000 - p.wall[i]
        p.seen.value += 1


def latency_handler(conn: psycopg.Connection[Any], records: Any) -> None:
    p = _PROBES
    assert p is not None
    for r in records:
        _probe(r.data["i"], r.id)
        if r.position is not None:
            p.seq[r.data["i"]] = r.position[1]


def _timed_sends(streamer: Streamer, probes: Probes) -> None:
    """Note, per position, when ``streamer`` called Redis with it and when Redis confirmed it (monotonic)."""
    publisher = streamer.publisher
    send_all = publisher.send_all

    def timed(targets: Any, identity: Any, first: dict[str, int]) -> Any:
        called = time.monotonic()
        out = send_all(targets, identity, first)
        confirmed = time.monotonic()
        for target, payload in targets.items():
            for seq in range(first[target], min(first[target] + payload.count, len(probes.called))):
                probes.called[seq], probes.confirmed[seq] = called, confirmed
        return out

    publisher.send_all = timed  # type: ignore[method-assign]


def _payload(i: int) -> dict[str, Any]:
    return {"id": i + 1, "distance": 1.0 + (i % 1000) / 10, "rider": f"r-{i % 10000:04d}", "pilot": "p-01", "i": i}


# -- processes -------------------------------------------------------------------------------------------------------


def _streamer_main(urls: Urls, variant: str, ready: Any, stop: Any, probes: Probes | None = None) -> None:
    worker_init()
    if variant.startswith("unilog"):
        with Streamer(urls.settings(), name="bench-latency") as streamer:
            if probes is not None:
                _timed_sends(streamer, probes)
            streamer.connect()
            ready.set()
            streamer.run(stop)
        return
    ref = ReferenceStreamer(urls.database, urls.redis, REF_STREAM)
    ready.set()
    ref.run(stop)
    ref.close()


def _consumer_main(urls: Urls, variant: str, probes: Probes, ready: Any, stop: Any) -> None:
    global _PROBES
    worker_init()
    _PROBES = probes
    if variant.startswith("unilog"):
        with Consumer(urls.settings(), ConsumerConfig(name="bench-latency"), latency_handler) as consumer:
            consumer.connect()
            ready.set()
            consumer.run(stop)
        return
    ref = ReferenceConsumer(
        urls.database, urls.redis, REF_STREAM, "bench-latency", lambda entry_id, d: _probe(d["i"], entry_id)
    )
    ready.set()
    ref.run(stop)
    ref.close()


def _produce(conn: psycopg.Connection[Any], variant: str, i: int, probes: Probes) -> None:
    data = _payload(i)
    if variant.startswith("unilog"):
        emit(conn, action="create", object="ride", data=data, key=f"ride-{i + 1}")
    else:
        conn.execute(RAW_INSERT, (psycopg.types.json.Jsonb(data),))
    probes.wall[i] = time.time()
    probes.t0[i] = time.monotonic()
    conn.commit()
    probes.committed[i] = time.monotonic()


def _producer_main(
    urls: Urls, variant: str, rate: float, n: int, probes: Probes, behind_out: Any, threads: int = PRODUCER_THREADS
) -> None:
    worker_init()
    conns = [psycopg.connect(urls.database) for _ in range(threads)]
    start = time.monotonic() + 0.2
    behind = [0.0] * threads

    def loop(k: int) -> None:
        for i in range(k, n, threads):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                behind[k] = max(behind[k], -delay)
            _produce(conns[k], variant, i, probes)

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for c in conns:
        c.close()
    behind_out.value = max(behind)


# -- coordinator -----------------------------------------------------------------------------------------------------


def _caught_up(env: BenchEnv, variant: str) -> bool:
    """Nothing staged and the consumer's checkpoint at the stream's last entry (records it skipped never arrive)."""
    if env.staged():
        return False
    unilog = variant.startswith("unilog")
    stream, query = (env.urls.stream, CHECKPOINT_UNILOG) if unilog else (REF_STREAM, CHECKPOINT_REF)
    row = env.admin.execute(query).fetchone()
    last: Any = env.rds.xrevrange(stream, count=1)
    return bool(row and last and row[0] == last[0][0].decode())


def _wait_settled(env: BenchEnv, variant: str, seen: Any, n: int) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    last, last_change = seen.value, time.monotonic()
    while seen.value < n and time.monotonic() < deadline:
        time.sleep(0.05)
        if seen.value != last:
            last, last_change = seen.value, time.monotonic()
        elif time.monotonic() - last_change > STALL_TIMEOUT or _caught_up(env, variant):
            return


def latency_trial(
    env: BenchEnv,
    variant: str,
    rate: int,
    seconds: float,
    *,
    consumer_main: Any = None,
    before_producer: Any = None,
    threads: int = PRODUCER_THREADS,
    extra: tuple[Any, ...] = (),
) -> tuple[dict[str, float], dict[str, Any]]:
    """One trial; ``consumer_main(urls, probes, ready, stop)`` replaces unilog's consumer process (the Spark one);
    ``before_producer()`` runs once the pipeline is up, just before the producer starts; ``threads`` producer
    connections; each of ``extra`` is a ``main(urls, ready, stop)`` run beside the pipeline (another consumer)."""
    env.reset()
    if variant == "unilog-wal":
        enable_wal(env.urls.settings())
    try:
        return _trial(env, variant, rate, seconds, consumer_main, before_producer, threads, extra)
    finally:
        if variant == "unilog-wal":
            disable_wal(env.urls.settings())


def _trial(
    env: BenchEnv,
    variant: str,
    rate: int,
    seconds: float,
    consumer_main: Any,
    before_producer: Any,
    threads: int,
    extra: tuple[Any, ...],
) -> tuple[dict[str, float], dict[str, Any]]:
    n = int(rate * seconds)
    probes, behind = Probes.create(n), SPAWN.Value("d", 0.0, lock=False)
    stop, ready_s, ready_c = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    ready_x = [SPAWN.Event() for _ in extra]
    pipeline = [
        *(SPAWN.Process(target=main, args=(env.urls, ready, stop)) for main, ready in zip(extra, ready_x, strict=True)),
        SPAWN.Process(target=_streamer_main, args=(env.urls, variant, ready_s, stop, probes)),
        SPAWN.Process(target=_consumer_main, args=(env.urls, variant, probes, ready_c, stop))
        if consumer_main is None
        else SPAWN.Process(target=consumer_main, args=(env.urls, probes, ready_c, stop)),
    ]
    for p in pipeline:
        p.start()
    if not (ready_s.wait(60) and ready_c.wait(180) and all(r.wait(60) for r in ready_x)):
        raise RuntimeError("latency: streamer or consumer did not start")
    producer = SPAWN.Process(target=_producer_main, args=(env.urls, variant, rate, n, probes, behind, threads))
    if before_producer is not None:
        before_producer()
    producer.start()
    producer.join()
    producing = max(probes.committed) - min(t for t in probes.t0 if t > 0) if n else 0.0  # first to last commit
    _wait_settled(env, variant, probes.seen, n)
    stop.set()
    for p in pipeline:
        p.join(30)
        if p.is_alive():
            p.kill()
    notes = {"records": n, "producer_max_behind_s": round(behind.value, 4), "producer_seconds": round(producing, 3)}
    return _metrics(probes, n), notes


def _metrics(p: Probes, n: int) -> dict[str, float]:
    """End-to-end p50/p99/max, records never seen, and where the time went (commit; commit start to XADD)."""
    seen = [i for i in range(n) if p.latency[i] > 0]
    total = sorted(p.latency[i] * 1000 for i in seen)
    commit = sorted((p.committed[i] - p.t0[i]) * 1000 for i in seen)
    to_xadd = sorted(p.to_xadd[i] * 1000 for i in seen)
    after_commit = sorted((p.to_xadd[i] - (p.committed[i] - p.t0[i])) * 1000 for i in seen)
    bracketed = [i for i in seen if p.seq[i] and p.called[p.seq[i]]]  # unilog's consumer notes positions
    called = sorted((p.called[p.seq[i]] - p.t0[i]) * 1000 for i in bracketed)
    confirmed = sorted((p.confirmed[p.seq[i]] - p.t0[i]) * 1000 for i in bracketed)
    called_after = sorted((p.called[p.seq[i]] - p.committed[i]) * 1000 for i in bracketed)
    brackets = {
        "to publish call p50 ms": percentile(called, 0.50),  # the XADD comes after this ...
        "to publish call p99 ms": percentile(called, 0.99),
        "to Redis confirmed p50 ms": percentile(confirmed, 0.50),  # ... and before this (Redis's AOF fsync in it)
        "to Redis confirmed p99 ms": percentile(confirmed, 0.99),
        "after commit to publish call p50 ms": percentile(called_after, 0.50),
    }
    return {
        "p50 ms": percentile(total, 0.50),
        "p99 ms": percentile(total, 0.99),
        "max ms": total[-1] if total else float("nan"),
        "missing": float(n - len(seen)),
        "commit p50 ms": percentile(commit, 0.50),
        "commit p99 ms": percentile(commit, 0.99),
        "to XADD p50 ms": percentile(to_xadd, 0.50),
        "to XADD p99 ms": percentile(to_xadd, 0.99),
        "after commit to XADD p50 ms": percentile(after_commit, 0.50),  # the commit's own fsync left out
        **(brackets if bracketed else {}),
    }


def run_latency(env: BenchEnv, profile: Profile, results: Results) -> None:
    for rate in profile.latency_rates:
        reference = profile.reference_rates is None or rate in profile.reference_rates
        variants = ("unilog", "unilog-wal", *(("reference",) if reference else ()))
        rounds = f"{profile.latency_reps} rounds of {', '.join(variants)}"
        log(f"latency: {rate}/s for {profile.latency_seconds:g} s, {rounds}")
        interleaved(
            results,
            "latency",
            f"{rate}/s x {profile.latency_seconds:g}s",
            variants,
            profile.latency_reps,
            lambda v, rate=rate: latency_trial(env, v, rate, profile.latency_seconds),  # type: ignore[misc]
        )
