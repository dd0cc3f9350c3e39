"""One batch appended to one Redis stream, with Redis's answer turned into the streamer's terms (shared by the
table and WAL passes)."""

from __future__ import annotations

import structlog

from .. import engine, store
from ..errors import PublishError, RedisOutOfMemory

log = structlog.get_logger(__name__)


def send(
    rds: engine.RedisStreams,
    stream: str,
    identity: store.ProducerIdentity,
    first_seq: int,
    payload: engine.Packed,
    dedupe: bool,
    wait_replicas: int,
    wait_timeout_ms: int,
) -> engine.PublishResult:
    """Append ``payload`` to ``stream`` at positions from ``first_seq``; raise :class:`PublishError` (retried, the
    records stay staged) unless Redis confirmed it and ``wait_replicas`` replicas acknowledged it in time. Logs a
    gap (Redis lost confirmed positions) and positions the broker skipped as already present."""
    try:
        result = rds.publish(
            stream,
            identity.producer_id,
            identity.epoch,
            first_seq,
            payload,
            dedupe=dedupe,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
        )
    except (engine.RedisError, OSError) as exc:
        if engine.out_of_memory(exc):  # the script's error quotes Lua internals: say what happened instead
            raise RedisOutOfMemory(
                f"Redis is out of memory (maxmemory reached) and refused the batch of {payload.count} records for "
                f"{stream}; they stay staged in Postgres and are published once Redis has room (raise maxmemory, or "
                "find the consumer that holds retention back: unilog status)"
            ) from None
        raise PublishError(f"Redis did not confirm the batch for {stream}: {exc}") from exc
    if result.replicas < wait_replicas:
        raise PublishError(
            f"only {result.replicas} of {wait_replicas} replicas acknowledged the batch for {stream} "
            f"within {wait_timeout_ms} ms; keeping the records staged and retrying"
        )
    if result.gap_after is not None:
        log.error(
            "stream is missing confirmed positions: Redis lost data",
            stream=stream,
            producer=identity.producer_id,
            high_water=result.gap_after,
            first_seq=first_seq,
        )
    if result.skipped:
        log.info("re-sent positions skipped by the broker", stream=stream, skipped=result.skipped)
    return result
