"""The chaos fleet: the app's API and simulator, two direct producers, the streamers, the checkpoint consumers, the
group's workers and the Spark consumer, each wrapped so its work is recorded and its faults are seeded."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..app import App, spark_env
from ..supervisor import ProcessSpec

if TYPE_CHECKING:
    from .config import ChaosConfig

PRODUCERS = ("producer0", "producer1")
HARNESS = "unilog.harness.chaos"  # python -m HARNESS produce | streamer | consume | spark
REWIND_GRACE = 60.0  # seconds: a failover, the killed master's restart (up to 4 s) and its resync, with margin


def fleet_specs(
    app: App,
    config: ChaosConfig,
    handler: str,
    *,
    api_port: int,
    history_dir: Path,
    state_dir: Path,
    python: str = sys.executable,
) -> list[ProcessSpec]:
    """The chaos fleet (half of the streamers and consumers exit on an injected crash, the others restart
    in-process), the Spark consumer (``config.use_spark(app)``) and ``config.extra_processes``."""
    specs = [ProcessSpec("api", app.api_argv(api_port, config.api, python))]
    specs += _streamers(app, config, python, state_dir)
    specs += _consumers(app, config, handler, python, state_dir)
    if config.use_spark(app):
        checkpoint = str(state_dir / f"{app.spark_name}-checkpoint")
        argv = [python, "-m", HARNESS, "spark", app.spark_name, "--app", _app_ref(app), "--checkpoint", checkpoint]
        specs.append(ProcessSpec(app.spark_name, argv, spark_env()))
    specs.extend(config.extra_processes)
    specs += _producers(app, config, python, history_dir)
    simulator = [python, "-m", app.module(app.simulator), "--api", f"http://127.0.0.1:{api_port}"]
    history = str(history_dir / "simulator.jsonl")
    specs.append(
        ProcessSpec(
            "simulator", [*simulator, "--rate", str(config.rate), "--seed", str(config.seed), "--history", history]
        )
    )
    return specs


def _seeded(config: ChaosConfig, state_dir: Path, name: str, index: int) -> list[str]:
    """A fault seed per process and incarnation: a process restarted after a crash must not replay that crash."""
    incarnations = str(state_dir / f"{name}.incarnations")
    return ["--seed-base", str(config.seed * 100 + index), "--incarnations", incarnations]


def _faults(config: ChaosConfig, spec: str) -> dict[str, str]:
    return {"UNILOG_FAULTS": spec if config.library_faults else ""}


def _streamers(app: App, config: ChaosConfig, python: str, state_dir: Path) -> list[ProcessSpec]:
    specs = []
    for i, name in enumerate(app.streamers):
        argv = [python, "-m", HARNESS, "streamer", *_seeded(config, state_dir, name, i), "--name", name]
        argv += ["--poll-interval", "0.5", *(["--exit-on-crash"] if i else [])]
        if config.redis_cluster:  # nothing deleted before a replica has it: a failover loses nothing staged
            argv += ["--wait-replicas", "1", "--wait-timeout-ms", "1000"]
        specs.append(ProcessSpec(name, argv, _faults(config, config.streamer_faults)))
    return specs


def _consumers(app: App, config: ChaosConfig, handler: str, python: str, state_dir: Path) -> list[ProcessSpec]:
    consume = [python, "-m", HARNESS, "consume", "--handler", handler]
    common = ["--stream", app.stream, "--log-json", "--block-ms", "250"]
    specs = []
    for i, name in enumerate(app.consumers):
        argv = [*consume, *_seeded(config, state_dir, name, 10 + i), "--name", name, *common]
        if config.redis_cluster:  # what a failover took from the stream is re-sent by the waiting streamers
            argv += ["--rewind-grace", str(REWIND_GRACE)]
        specs.append(
            ProcessSpec(name, argv + (["--exit-on-crash"] if i else []), _faults(config, config.consumer_faults))
        )
    for i, name in enumerate(app.group_workers):
        argv = [*consume, "--fail-poison", *_seeded(config, state_dir, name, 20 + i), "--group", app.group]
        argv += ["--worker", name, *common, "--claim-idle-ms", "2000", "--max-deliveries", "3"]
        specs.append(ProcessSpec(name, argv + (["--exit-on-crash"] if i else []), _faults(config, config.group_faults)))
    return specs


def _producers(app: App, config: ChaosConfig, python: str, history_dir: Path) -> list[ProcessSpec]:
    specs = []
    for i, name in enumerate(PRODUCERS):
        argv = [python, "-m", HARNESS, "produce", "--app", _app_ref(app), "--name", name]
        argv += ["--history", str(history_dir / f"{name}.jsonl"), "--seed", str(config.seed * 100 + 30 + i)]
        argv += [
            "--rate",
            str(config.producer_rate),
            "--rollback",
            str(config.rollback),
            "--poison",
            str(config.poison),
        ]
        specs.append(ProcessSpec(name, argv))
    return specs


def _app_ref(app: App) -> str:
    """Where a process finds the app's description: ``<package>.fleet:APP`` by convention."""
    return app.module("fleet:APP")
