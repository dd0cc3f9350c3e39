"""``unilog chaos``: the whole system under a seeded schedule of faults, then a Jepsen-style verdict.

The runner (:func:`run_chaos`) takes an application (:class:`~unilog.harness.app.App`; the demo's is Rocket
Rides), starts Postgres and Redis (embedded, or the servers you give it), one
:class:`~unilog.harness.proxy.FaultProxy` in front of each, and the app's fleet as separate processes under
:class:`~unilog.harness.supervisor.Fleet` (restarted when they exit):

* producers: the app's API (gunicorn) driven by its simulator, and two direct library producers
  (``python -m unilog.harness.chaos produce``) that keep several transactions open at once on several
  connections, commit them out of order, roll a share of them back, and now and then stage a *poison* record;
* two streamers (one publishes, one stands by);
* the app's checkpoint consumers and consumer group, each running the handler under test (the app's, or yours)
  wrapped by :func:`tracked`, which records every record it applies in ``chaos_applied`` in the handler's own
  transaction (no unique constraint: a record applied twice shows up twice). The group's wrapper fails on poison
  records, so they must end up dead-lettered.

Every producer writes its history as JSON lines (:class:`HistoryWriter`): an ``attempt`` before the transaction
commits and its ``outcome`` after (``committed``, ``rolled_back``, or ``unknown`` when the commit itself failed or
the process died first). The direct producers also write each record's chaos id (``cid``) into
``chaos_produced`` in the same transaction, so the database says which unknown outcomes did commit; API rides are
identified as ``<object>-<id>`` and the app's source table is canonical for them.

The fault schedule is drawn up front from ``random.Random(seed)`` (:func:`build_schedule`): SIGKILL of any fleet
process, SIGSTOP/SIGCONT pauses, Redis restarts (SIGKILL, AOF with ``appendfsync always``), Redis pauses, Postgres
immediate restarts, and connection resets, cuts, blackholes and dropped replies on either proxy. The library's own
faults (double-sends, crashes between steps) run inside the processes at fixed rates with seeds derived from the
run's. The same seed and options give the same schedule. On a Redis Cluster (``redis_cluster``) masters are killed
instead of Redis restarts; with Postgres HA (``postgres_ha``: a primary and a synchronous standby, a proxy in front
of each) the primary fails over (``pg_failover``: killed, standby promoted, old primary rewound back as standby)
instead of Postgres restarts.

At the end the runner heals everything (proxies pass, every process continued, servers up), stops the producers,
waits until the system is quiet (nothing staged, every consumer at the end of the stream, nothing pending) and
checks (:func:`check`, on data read by :func:`collect`): nothing committed is lost by any consumer, nothing rolled
back or never attempted is applied, nothing is applied twice, dead letters hold only poison records, and every
consumer's state equals the canonical one. Unknown outcomes may be applied once or not at all.

:func:`check` is a pure function over plain data, so you can run it on your own fleet's history;
:func:`run_chaos` takes your consumer handler (``ChaosConfig(handler="myapp.consumers:handle")``). Modules:
``history``, ``checker``, ``schedule``, ``injector``, ``observe``, ``tracking`` and ``tables`` (the chaos tables),
``specs`` (the fleet), ``producer`` and ``processes`` (the fleet's own processes), ``pgha`` (Postgres failovers),
``report``, ``runner``.
"""

from __future__ import annotations

from .checker import Verdict, Violation, check
from .config import ChaosConfig
from .history import OUTCOMES, HistorySummary, HistoryWriter, read_history, summarize_history
from .injector import Executed, Injector
from .observe import Observation, Progress, collect, progress
from .producer import ChaosProducer
from .report import format_summary, print_schedule
from .runner import ChaosResult, run_chaos
from .schedule import FaultEvent, FaultRates, build_schedule
from .specs import PRODUCERS, fleet_specs
from .tracking import POISON_ACTION, POISON_OBJECT, PoisonRecord, cid_of, is_poison, record_cid, tracked

__all__ = [
    "OUTCOMES",
    "POISON_ACTION",
    "POISON_OBJECT",
    "PRODUCERS",
    "ChaosConfig",
    "ChaosProducer",
    "ChaosResult",
    "Executed",
    "FaultEvent",
    "FaultRates",
    "HistorySummary",
    "HistoryWriter",
    "Injector",
    "Observation",
    "PoisonRecord",
    "Progress",
    "Verdict",
    "Violation",
    "build_schedule",
    "check",
    "cid_of",
    "collect",
    "fleet_specs",
    "format_summary",
    "is_poison",
    "print_schedule",
    "progress",
    "read_history",
    "record_cid",
    "run_chaos",
    "summarize_history",
    "tracked",
]
