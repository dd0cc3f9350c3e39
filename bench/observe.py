"""``observe``: what metrics and traces cost the drain and the consumer, measured against themselves in one run.

Variants, interleaved, each trial in a fresh process:

* ``default``: as shipped: metrics updated per batch (not served), OpenTelemetry API installed, no SDK configured,
  records without trace context;
* ``no-metrics``: the metric updates replaced by no-ops in the trial's process (the baseline for metrics);
* ``traced``: an OpenTelemetry SDK configured (spans recorded, exported nowhere); for the drain every staged record
  also carries a traceparent, so entries get the two trace fields and the publish span links them.

Ratios: ``default / no-metrics`` is the cost of metrics, ``traced / default`` the cost of tracing.
"""

from __future__ import annotations

import time
from typing import Any

from unilog import Consumer, ConsumerConfig, Streamer
from unilog.wire import registry_key

from .core import Profile, Results, in_fresh_process, interleaved, log
from .env import BenchEnv, Urls
from .handlers import count_records

VARIANTS = ("default", "no-metrics", "traced")
NAME = "bench-observe"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _configure(variant: str) -> None:
    """In the trial's own process: switch metrics off, or an OpenTelemetry SDK on."""
    if variant == "no-metrics":
        from unilog import metrics

        def nothing(*_args: Any, **_kwargs: Any) -> None:
            return None

        metrics.batch_published = nothing
        metrics.batch_consumed = nothing
    elif variant == "traced":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())


def _drain(urls: Urls, variant: str) -> tuple[int, float]:
    _configure(variant)
    with Streamer(urls.settings()) as streamer:
        streamer.connect()
        started = time.perf_counter()
        count = streamer.drain()
        return count, time.perf_counter() - started


def _consume(urls: Urls, variant: str) -> tuple[int, float]:
    _configure(variant)
    with Consumer(urls.settings(), ConsumerConfig(name=NAME), count_records) as consumer:
        consumer.connect()
        started = time.perf_counter()
        count = consumer.drain()
        return count, time.perf_counter() - started


def drain_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset()
    env.stage(size)
    if variant == "traced":
        env.admin.execute("UPDATE staged_log_records SET traceparent = %s", (TRACEPARENT,))
        env.settle()
    count, elapsed = in_fresh_process(_drain, env.urls, variant)
    ok = count == size and env.staged() == 0 and env.xlen(env.urls.stream) == size
    if not ok:
        log(f"  WARNING observe drain {variant}: published {count} of {size}")
    return {"records/s": size / elapsed, "seconds": elapsed}, {"count": count, "ok": ok}


def consume_trial(env: BenchEnv, variant: str, size: int) -> tuple[dict[str, float], dict[str, Any]]:
    env.reset(keep_redis=True)
    env.rds.delete(registry_key(env.urls.stream))
    count, elapsed = in_fresh_process(_consume, env.urls, variant)
    if count != size:
        log(f"  WARNING observe consume {variant}: handled {count} of {size}")
    return {"records/s": count / elapsed, "seconds": elapsed}, {"count": count}


def _prefill(urls: Urls) -> int:
    with Streamer(urls.settings()) as streamer:
        return streamer.drain()


def run_observe(env: BenchEnv, profile: Profile, results: Results) -> None:
    size = profile.observe_size or profile.drain_sizes[0]
    drain_reps, consume_reps = profile.observe_reps or profile.drain_reps, profile.observe_reps or profile.consume_reps
    log(f"observe: drain {size:,} records, {drain_reps} rounds of {', '.join(VARIANTS)}")
    interleaved(
        results,
        "observe-drain",
        f"{size:,} records",
        VARIANTS,
        drain_reps,
        lambda v: drain_trial(env, v, size),
    )
    size = profile.observe_size or profile.consume_size
    env.reset()
    env.stage(size)
    in_fresh_process(_prefill, env.urls)
    env.compact_aof()
    log(f"observe: consume {size:,} entries, {consume_reps} rounds of {', '.join(VARIANTS)}")
    interleaved(
        results,
        "observe-consume",
        f"{size:,} entries",
        VARIANTS,
        consume_reps,
        lambda v: consume_trial(env, v, size),
    )
