"""``produce``: what staging a record costs the producer's own business transaction.

Two client processes, one connection each, run ``INSERT INTO bench_rides ... RETURNING id; COMMIT`` back to back
for a fixed time (``synchronous_commit`` on, fsync on); the ``emit`` variant also calls ``unilog.emit`` in the same
transaction. No streamer runs, so the staged table only grows (as during a streamer outage).

Two diagnostic variants separate the costs: ``emit, no NOTIFY`` disables unilog's statement trigger (``pg_notify``
at commit) for the trial; ``plain INSERT`` replaces ``emit`` by the cheapest extra statement an outbox could make,
an ``INSERT ... RETURNING id`` of the same JSON into a table with nothing but a primary key: the floor that any
design staging a row with its own statement pays.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from unilog import emit, emit_async, store

from .core import SPAWN, Measurement, Profile, Results, interleaved, log, worker_init
from .env import BenchEnv, Urls

CLIENTS = 2
VARIANTS = ("without emit", "with emit", "emit, no NOTIFY", "plain INSERT", "async, without emit", "async, with emit")
INSERT_RIDE = "INSERT INTO bench_rides (distance) VALUES (%s) RETURNING id"
INSERT_PLAIN = "INSERT INTO bench_outbox (data) VALUES (%s::jsonb) RETURNING id"
TRIGGER = "staged_log_records_notify"


def _business_tx(conn: psycopg.Connection[Any], stage: str, n: int, commit: bool = True) -> None:
    distance = 1.0 + (n % 1000) / 10
    row = conn.execute(INSERT_RIDE, (distance,)).fetchone()
    assert row is not None
    data = {"id": row[0], "distance": distance}
    if stage == "emit":
        emit(conn, action="create", object="ride", data=data, key=f"ride-{row[0]}")
    elif stage == "plain":
        conn.execute(INSERT_PLAIN, (json.dumps(data, separators=(",", ":")),)).fetchone()
    conn.commit() if commit else conn.rollback()


def _client_main(urls: Urls, stage: str, seconds: float, barrier: Any, out: Any) -> None:
    worker_init()
    with psycopg.connect(urls.database) as conn:
        _business_tx(conn, stage, 0, commit=False)  # warm up (imports, prepared statements) outside the clock
        barrier.wait()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            _business_tx(conn, stage, n)
            n += 1
        out.put(n)


async def _async_business_tx(conn: psycopg.AsyncConnection[Any], stage: str, n: int) -> None:
    distance = 1.0 + (n % 1000) / 10
    row = await (await conn.execute(INSERT_RIDE, (distance,))).fetchone()
    assert row is not None
    if stage == "emit":
        data = {"id": row[0], "distance": distance}
        await emit_async(conn, action="create", object="ride", data=data, key=f"ride-{row[0]}")
    await conn.commit()


async def _async_client(urls: Urls, stage: str, seconds: float, barrier: Any) -> int:
    async with await psycopg.AsyncConnection.connect(urls.database) as conn:
        await conn.execute("SELECT 1")
        await conn.rollback()
        barrier.wait()
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            await _async_business_tx(conn, stage, n)
            n += 1
        return n


def _async_client_main(urls: Urls, stage: str, seconds: float, barrier: Any, out: Any) -> None:
    """The same business transaction from asyncio code (psycopg's AsyncConnection, ``emit_async``)."""
    import asyncio

    worker_init()
    out.put(asyncio.run(_async_client(urls, stage, seconds, barrier)))


def produce_trial(
    env: BenchEnv, variant: str, seconds: float, clients: int = CLIENTS
) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset(keep_redis=True)
    env.settle()
    stage = {"without emit": "", "plain INSERT": "plain", "async, without emit": ""}.get(variant, "emit")
    target = _async_client_main if variant.startswith("async") else _client_main
    if variant == "emit, no NOTIFY":
        env.admin.execute(f"ALTER TABLE staged_log_records DISABLE TRIGGER {TRIGGER}")
    sleeper = psycopg.connect(env.urls.database, autocommit=True)
    if variant == "emit, streamer asleep":  # every commit notifies, as before the quiet wake-up (unilog_0007)
        assert store.try_sleep(sleeper)
    try:
        barrier, out = SPAWN.Barrier(clients), SPAWN.Queue()
        args = (env.urls, stage, seconds, barrier, out)
        procs = [SPAWN.Process(target=target, args=args) for _ in range(clients)]
        for p in procs:
            p.start()
        counts = [out.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join()
    finally:
        sleeper.close()
        env.admin.execute(f"ALTER TABLE staged_log_records ENABLE TRIGGER {TRIGGER}")
    total = sum(counts)
    staged = env.staged()
    if stage == "emit" and staged != total:
        log(f"  WARNING produce {variant}: {total} transactions but {staged} staged records")
    return {"tx/s": total / seconds}, {"transactions": total, "staged": staged}


def run_produce(env: BenchEnv, profile: Profile, results: Results) -> None:
    log(f"produce: {CLIENTS} clients x {profile.produce_seconds:g} s, {profile.produce_reps} rounds of {VARIANTS}")
    interleaved(
        results,
        "produce",
        f"{CLIENTS} clients x {profile.produce_seconds:g}s",
        VARIANTS,
        profile.produce_reps,
        lambda v: produce_trial(env, v, profile.produce_seconds),
        core=("with emit", "without emit"),
        side_reps=profile.side_reps,
    )


SCALING_VARIANTS = ("plain INSERT", "with emit", "emit, WAL mode", "without emit", "emit, streamer asleep")


def run_produce_clients(env: BenchEnv, profile: Profile, results: Results) -> None:
    """emit against the second-INSERT floor as clients grow (issue 18), in lockstep slices: every client runs one
    variant for ``slice_seconds``, then all switch to the next, round after round. Variants of a round run within a
    few seconds of each other, so the per-round ratio cancels the machine's drift (trials of seconds apart differed
    by 10-40 % here), and the median over many rounds is the figure.

    ``with emit``: table mode while the streamer is busy (no streamer sleeps, so no commit notifies); ``emit, WAL
    mode``: emit as WAL capture makes it, a transactional logical message rather than a row (the slot's reader is
    not on the producer's path); ``emit, streamer asleep``: a session holds the wake-up lock, so
    every commit notifies (a real streamer wakes at the first one and stays awake while commits keep coming)."""
    for clients in profile.scaling_clients:
        log(
            f"produce_clients: {clients} clients, {profile.slice_rounds} rounds of {SCALING_VARIANTS} x "
            f"{profile.slice_seconds:g} s"
        )
        lockstep(env, results, clients, profile.slice_rounds, profile.slice_seconds)


def lockstep(env: BenchEnv, results: Results, clients: int, rounds: int, seconds: float) -> None:
    env.reset(keep_redis=True)
    env.settle()
    # a barrier that times out: a client that died (or a coordinator that raised) breaks it for all, not a hang
    barrier, out = SPAWN.Barrier(clients + 1, timeout=seconds + 120), SPAWN.Queue()
    args = (env.urls, rounds, seconds, barrier, out)
    procs = [SPAWN.Process(target=_lockstep_client, args=args) for _ in range(clients)]
    for p in procs:
        p.start()
    sleeper = psycopg.connect(env.urls.database, autocommit=True)
    try:
        for _ in range(rounds):
            env.admin.execute("TRUNCATE bench_rides, bench_outbox, staged_log_records")
            for variant in SCALING_VARIANTS:
                barrier.wait()  # every client is between slices: the table can change
                _layout(env.admin, wal=variant == "emit, WAL mode")
                asleep = variant == "emit, streamer asleep"
                if asleep and not store.try_sleep(sleeper):
                    raise RuntimeError("the wake-up lock is held by another session: the trial would not notify")
                barrier.wait()  # go
                barrier.wait()  # the slice ended
                if asleep:
                    store.wake(sleeper)
        counts: dict[tuple[int, str], int] = {}
        for _ in procs:
            for key, n in out.get(timeout=120).items():
                counts[key] = counts.get(key, 0) + n
        for p in procs:
            p.join()
    finally:
        barrier.abort()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        sleeper.close()
        _layout(env.admin, wal=False)
    for (rnd, variant), n in sorted(counts.items()):
        results.add(Measurement("produce_clients", f"{clients} clients", variant, rnd, {"tx/s": n / seconds}))


def _layout(admin: psycopg.Connection[Any], *, wal: bool) -> None:
    """The staging table as table mode (trigger on, read index) or WAL capture (neither, and emit writes logical
    messages) leaves it."""
    store.set_notify_trigger(admin, not wal)
    store.set_read_index(admin, not wal)
    store.set_emit_messages(admin, wal, wait=False)


def _lockstep_client(urls: Urls, rounds: int, seconds: float, barrier: Any, out: Any) -> None:
    worker_init()
    stages = {"plain INSERT": "plain", "without emit": ""}
    counts: dict[tuple[int, str], int] = {}
    with psycopg.connect(urls.database) as conn:
        for stage in ("", "plain", "emit"):
            for n in range(20):
                _business_tx(conn, stage, n, commit=False)  # warm up outside the clock
        for rnd in range(rounds):
            for variant in SCALING_VARIANTS:
                stage = stages.get(variant, "emit")
                barrier.wait()
                barrier.wait()
                end, n = time.monotonic() + seconds, 0
                while time.monotonic() < end:
                    _business_tx(conn, stage, n)
                    n += 1
                counts[(rnd, variant)] = n
                barrier.wait()
    out.put(counts)
