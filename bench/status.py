"""``status``: how long the operators' reads take over many streams (issue 46 item 4), in one run: ``unilog status``'s
report (:func:`unilog.ops.status.collect_status`), one exporter scrape and one dashboard sample, over 1, 1,000 and
10,000 streams (``--quick``: 1 and 1,000). ``python -m bench --only status``; not in the default run (setting up
10,000 streams takes a while).

Each stream has 3 entries and a checkpoint consumer that read the first; one stream in a hundred has a consumer group
with an entry pending. The figure is seconds per read (median of the rounds); the ratio is against one stream in the
same run. The target is under a second at 10,000 streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from unilog.ops.dashboard import History
from unilog.ops.exporter import SystemCollector
from unilog.ops.status import collect_status

from .core import Measurement, Profile, Results, log
from .env import BenchEnv

COUNTS_FULL = (1, 1_000, 10_000)
COUNTS_QUICK = (1, 1_000)
ROUNDS = 3


def _streams(env: BenchEnv, count: int) -> None:
    """``count`` streams ``s00000``... of 3 entries, a checkpoint after the first of each; a group on one in 100."""
    env.reset()
    names = [f"s{i:05d}" for i in range(count)]
    pipe = env.rds.pipeline(transaction=False)
    for name in names:
        for _ in range(3):
            pipe.xadd(name, {"data": "{}", "action": "create", "object": "ride"})
    pipe.execute()
    pipe = env.rds.pipeline(transaction=False)
    for name in names:
        pipe.xrange(name, count=1)
    firsts = [page[0][0].decode() for page in pipe.execute()]
    for name in names[::100]:
        env.rds.xgroup_create(name, "g", id="0")
        env.rds.xreadgroup("g", "w", {name: ">"}, count=1)
    with env.admin.cursor() as cur:
        cur.executemany(
            "INSERT INTO unilog_checkpoints (name, stream, last_id) VALUES (%s, %s, %s)",
            [(f"c-{name}", name, first) for name, first in zip(names, firsts, strict=True)],
        )


def _timed(read: Callable[[], object]) -> float:
    started = time.perf_counter()
    read()
    return time.perf_counter() - started


def run_status(env: BenchEnv, profile: Profile, results: Results) -> None:
    counts = COUNTS_QUICK if profile.name == "quick" else COUNTS_FULL
    settings = env.urls.settings()
    for count in counts:
        _streams(env, count)
        scrape, history = SystemCollector(settings).collect, History(settings)
        history.sample()  # the dashboard's rates need a sample before
        case = f"{count:,} streams"
        for rep in range(ROUNDS):
            metrics = {
                "status s": _timed(lambda: collect_status(settings)),
                "scrape s": _timed(lambda scrape=scrape: list(scrape())),  # type: ignore[misc]
                "dashboard sample s": _timed(history.sample),
            }
            results.add(Measurement("status", case, "status", rep, metrics))
        log(f"  status over {case}: {results.median('status', case, 'status', 'status s'):.3f} s")
