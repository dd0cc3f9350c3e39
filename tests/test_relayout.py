"""Moving a deployment to the hash-tagged Redis key layout: a streamer refuses a stream that still has keys in the
old layout (retention must see every registration), `unilog stream relayout` renames them, and publishing resumes
with its high-water mark, registrations and dead letters intact: nothing lost, nothing appended twice."""

from __future__ import annotations

from typing import Any

import psycopg
from cli import unilog

from unilog import Settings, emit
from unilog.cli import ExitCode
from unilog.wire import attempts_key, dlq_key, hwm_key, legacy_keys, registry_key


def stage(settings: Settings, n: int) -> None:
    with psycopg.connect(settings.conninfo) as conn:
        for i in range(n):
            emit(conn, action="create", object="ride", data={"n": i})


def test_an_old_layout_is_refused_then_moved_and_publishing_resumes(settings: Settings, pg: Any, rds: Any) -> None:
    stream = settings.stream
    stage(settings, 5)
    assert unilog(settings, "streamer", "--once").returncode == 0
    rds.hset(registry_key(stream), "c0", "0-0")
    rds.xadd(dlq_key(stream), {"data": "{}", "dlq_original_id": "1-0", "dlq_group": "g", "dlq_consumer": "w"})
    rds.hset(attempts_key(stream, "g"), "1-0", 2)
    old_names = {new: old for old, new in legacy_keys(stream).items()}
    old_names[attempts_key(stream, "g")] = f"unilog:attempts:{stream}:g"
    for new, old in old_names.items():  # as a deployment before the layout would have them
        if rds.exists(new):
            rds.rename(new, old)
    mark = rds.hgetall(f"unilog:hwm:{stream}")
    assert mark, "the high-water mark is in the old place"

    stage(settings, 3)
    refused = unilog(settings, "streamer", "--once")
    assert refused.returncode == ExitCode.CONFIG, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unilog stream relayout" in lines[0], lines
    assert pg.execute("SELECT count(*) FROM staged_log_records").fetchone() == (3,), "nothing lost"

    moved = unilog(settings, "stream", "relayout")
    assert moved.returncode == 0 and "4 keys moved" in moved.stdout, moved.stdout + moved.stderr
    assert rds.hgetall(hwm_key(stream)) == mark and rds.hget(registry_key(stream), "c0") == "0-0"
    assert rds.xlen(dlq_key(stream)) == 1 and rds.hget(attempts_key(stream, "g"), "1-0") == "2"
    assert not any(rds.exists(old) for old in old_names.values())
    assert unilog(settings, "stream", "relayout").stdout.count("0 keys moved") == 1, "idempotent"

    done = unilog(settings, "streamer", "--once")
    assert done.returncode == 0 and "streamed 3 records" in done.stdout, done.stderr
    seqs = [int(fields["seq"]) for _, fields in rds.xrange(stream)]
    assert seqs == list(range(1, 9)), "positions continue; nothing appended twice"
