"""One batch appended to one Redis stream, with Redis's answer turned into the streamer's terms (shared by the
table and WAL passes)."""

from __future__ import annotations

import structlog

from .. import engine, store
from ..errors import PublishError, RedisOutOfMemory

log = structlog.get_logger(__name__)


# Streams a batch's gap line names (Redis losing confirmed positions may touch every stream of a batch)
GAPS_NAMED = 50


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
        raise _refused(exc, f"the batch of {payload.count} records for {stream}") from exc
    check(result, stream, identity, first_seq, wait_replicas, wait_timeout_ms)
    return result


def send_many(
    rds: engine.RedisStreams,
    batches: list[tuple[str, int, engine.Packed]],
    identity: store.ProducerIdentity,
    wait_replicas: int,
    wait_timeout_ms: int,
    per_call: int | None = None,
) -> list[engine.PublishResult]:
    """:func:`send` of many streams' batches (``(stream, first_seq, payload)``), deduplicated, in one pipelined
    round trip (per Redis node; on a single Redis in script calls of about ``per_call`` records); raises as it does
    unless Redis confirmed every one of them."""
    try:
        results = rds.publish_many(
            batches,
            identity.producer_id,
            identity.epoch,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
            per_call=per_call,
        )
    except (engine.RedisError, OSError) as exc:
        cause = exc.refusal if isinstance(exc, engine.PartlyRefused) else exc
        if isinstance(exc, engine.PartlyRefused):
            ran = [(b, r) for b, r in zip(batches, exc.results, strict=True) if r is not None]
            _logged_many([b for b, _r in ran], [r for _b, r in ran], identity)  # a gap is said now or never
        if (no_retry := engine.batch_refusal(cause)) is not None:  # a replica, an ACL refusal: as one stream's
            raise no_retry from (exc if no_retry is cause else cause)
        records = sum(payload.count for _s, _f, payload in batches)
        raise _refused(cause, f"a batch of {records} records for {len(batches)} streams") from cause
    _logged_many(batches, results, identity)  # before a short acknowledgement raises: the re-send skips the gap
    for (stream, _first_seq, _payload), result in zip(batches, results, strict=True):
        _acknowledged(result, stream, wait_replicas, wait_timeout_ms)
    return results


def _logged_many(
    batches: list[tuple[str, int, engine.Packed]], results: list[engine.PublishResult], identity: store.ProducerIdentity
) -> None:
    """One line for a batch across streams with gaps, one for its positions skipped (never a line per stream: a batch
    over ten thousand streams re-sent after a failover wrote ten thousand), naming how many and the first (a gap's
    line names up to :data:`GAPS_NAMED` streams: each needs ``unilog reconcile``)."""
    pairs = list(zip(batches, results, strict=True))
    gaps = sorted((stream, first, r.gap_after) for (stream, first, _p), r in pairs if r.gap_after is not None)
    if gaps:
        stream, first_seq, high_water = gaps[0]
        log.error(
            "stream is missing confirmed positions: Redis lost data",  # one event name: the chaos report counts it
            streams=len(gaps),
            first=stream,
            named=sorted({g[0] for g in gaps})[:GAPS_NAMED],
            producer=identity.producer_id,
            high_water=high_water,
            first_seq=first_seq,
        )
    skipped: dict[str, int] = {}  # a target may have several batches (a stream's claims)
    for (stream, _first, _payload), r in pairs:
        if r.skipped:
            skipped[stream] = skipped.get(stream, 0) + r.skipped
    if skipped:
        log.info(
            "re-sent positions skipped by the broker",
            streams=len(skipped),
            skipped=sum(skipped.values()),
            first=min(skipped),
        )


def _refused(exc: BaseException, what: str) -> Exception:
    if engine.out_of_memory(exc):  # the script's error quotes Lua internals: say what happened instead
        return RedisOutOfMemory(
            f"Redis is out of memory (maxmemory reached) and refused {what}; they stay staged in Postgres and are "
            "published once Redis has room (raise maxmemory, or find the consumer that holds retention back: "
            "unilog status)"
        )
    return PublishError(f"Redis did not confirm {what}: {exc}")


def check(
    result: engine.PublishResult,
    stream: str,
    identity: store.ProducerIdentity,
    first_seq: int,
    wait_replicas: int,
    wait_timeout_ms: int,
) -> None:
    """Raise :class:`PublishError` unless ``wait_replicas`` replicas acknowledged the batch; log a gap (Redis lost
    confirmed positions) and positions the broker skipped as already present."""
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
    _acknowledged(result, stream, wait_replicas, wait_timeout_ms)  # after the gap's line: the re-send skips the gap


def _acknowledged(result: engine.PublishResult, stream: str, wait_replicas: int, wait_timeout_ms: int) -> None:
    """Raise :class:`PublishError` unless ``wait_replicas`` replicas acknowledged the batch for ``stream``."""
    if result.replicas < wait_replicas:
        raise PublishError(
            f"only {result.replicas} of {wait_replicas} replicas acknowledged the batch for {stream} "
            f"within {wait_timeout_ms} ms; keeping the records staged and retrying"
        )
