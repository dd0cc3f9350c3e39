"""How a streamer batches and waits (:class:`StreamerConfig`): apart from :mod:`unilog.stream.streamer`, so that
``unilog streamer``'s parser reads its defaults without importing the streamer and the adapters."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import validate_stream_name


@dataclass(frozen=True)
class StreamerConfig:
    """How the streamer batches and waits.

    ``streams`` limits the streamer to these target streams (None: every stream that has staged records; records staged
    without a stream go to ``Settings.stream``). ``poll_interval`` is the longest sleep between checks when no
    notification arrives. A table-mode streamer cannot sleep while a transaction that staged without notifying is open
    (its commit sends no NOTIFY): it looks again after ``wakeup_retry`` seconds, doubling up to ``wakeup_retry_max``,
    until that transaction ended. A backlog drains up to
    ``pipeline_batches`` batches per pass, Redis appending one batch while Postgres deletes the one before and fetches
    the one after (in WAL mode: saves the one before, and the slot's next is decoded). A batch is one script call in
    Redis, which serves no other client while it runs (about 5 us per record measured here: 25 ms for the default 5000);
    smaller batches trade drain rate (see bench/RESULTS.md) for shorter pauses. No record waits for another producer's
    transaction (table mode claims every committed row, :mod:`unilog.stream.capture_table`; WAL mode reads commits).
    While Redis's ``used_memory`` is at or above ``redis_memory_limit`` of its ``maxmemory`` (read every
    ``redis_memory_interval`` seconds), the streamer publishes nothing, so Redis never has to refuse a batch (0: no such
    pause; see :mod:`unilog.stream.backpressure`). With ``side_session`` (the default), a pass over many streams
    reads the next share of their backlog in a second Postgres session while its own claims the first
    (:mod:`unilog.stream.side_reads`): one more connection per streamer, opened at the first such pass.
    """

    batch_size: int = 5000
    pipeline_batches: int = 8
    poll_interval: float = 1.0
    wakeup_retry: float = 0.005
    wakeup_retry_max: float = 0.1
    streams: tuple[str, ...] | None = None
    max_backoff: float = 10.0
    restart_after_crash: bool = True
    retention_interval: float = 5.0
    max_len: int | None = None
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    redis_timeout: float = 10.0
    pg_timeout: float | None = 30.0
    redis_memory_limit: float = 0.9
    redis_memory_interval: float = 1.0
    side_session: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.pipeline_batches < 1:
            raise ValueError("pipeline_batches must be at least 1")
        for s in self.streams or ():
            validate_stream_name(s)
        if not 0 <= self.redis_memory_limit <= 1:
            raise ValueError("redis_memory_limit must be between 0 (no pause) and 1")
