"""One settings object for the three consumer kinds (issue 25): every setting validated at construction in one line,
partitioned consumers honour every checkpoint setting, and the command line offers exactly the settings."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from unilog import ConfigurationError, ConsumerConfig, GroupConfig, PartitionConfig
from unilog.consume.settings import CheckpointSettings, ConsumeSettings, add_arguments, from_arguments

# one value per shared setting that differs from every default, so a setting that is dropped on the way shows
CHANGED: dict[str, Any] = {
    "stream": "orders",
    "batch_size": 7,
    "block_ms": 70,
    "pg_timeout": 7.5,
    "max_backoff": 1.5,
    "restart_after_crash": False,
    "numbers": "decimal",
    "on_malformed": "stop",
    "wait_replicas": 2,
    "wait_timeout_ms": 250,
    "register": False,
    "register_interval": 30.0,
    "strict_start": True,
    "max_attempts": 9,
    "on_poison": "dead-letter",
    "rewind_grace": 4.0,
}


def test_the_changed_values_cover_every_checkpoint_setting() -> None:
    assert set(CHANGED) == {f.name for f in dataclasses.fields(CheckpointSettings)}


def test_a_partition_consumer_gets_every_checkpoint_setting() -> None:
    """Before: the partition worker copied 9 settings by hand; pg_timeout, register_interval and strict_start were
    lost."""
    config = PartitionConfig("totals", **CHANGED).partition(3, "orders:p3")
    assert config.name == "totals.p3"
    for name, value in CHANGED.items():
        assert getattr(config, name) == (value if name != "stream" else "orders:p3"), name


@pytest.mark.parametrize(
    ("kind", "identity", "setting", "value", "message"),
    [
        (ConsumerConfig, {"name": "c"}, "batch_size", 0, "batch_size must be at least 1, not 0"),
        (ConsumerConfig, {"name": "c"}, "on_poison", "skip", "on_poison must be one of stop, dead-letter, not 'skip'"),
        (PartitionConfig, {"name": "p"}, "on_poison", "skip", "on_poison must be one of"),
        (PartitionConfig, {"name": "p"}, "heartbeat_ttl", 0, "heartbeat_ttl must be more than 0"),
        (GroupConfig, {"group": "g"}, "max_deliveries", 0, "max_deliveries must be at least 1"),
        (GroupConfig, {"group": "g"}, "on_malformed", "drop", "on_malformed must be one of dead-letter, stop"),
        (GroupConfig, {"group": "g"}, "pg_timeout", -1, "pg_timeout must be at least 0"),
        (GroupConfig, {"group": "g"}, "wait_replicas", -1, "wait_replicas must be at least 0"),
        (ConsumerConfig, {"name": "c"}, "wait_timeout_ms", 0, "wait_timeout_ms must be at least 1"),
    ],
)
def test_every_setting_is_checked_at_construction_in_one_line(
    kind: Any, identity: dict[str, Any], setting: str, value: Any, message: str
) -> None:
    """Before: a partitioned consumer's on_poison was checked only when its first partition was acquired."""
    with pytest.raises(ConfigurationError, match=message) as caught:
        kind(**identity, **{setting: value})
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


def test_each_kind_keeps_its_python_defaults() -> None:
    assert ConsumerConfig("c").batch_size == 1000 and GroupConfig("g").batch_size == 500
    assert PartitionConfig("p").batch_size == 500 and PartitionConfig("p").block_ms == 500
    assert ConsumerConfig("c", batch_size=5).batch_size == 5


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_command_line_offers_every_setting_and_builds_each_kind() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    offered = {a.dest for a in parser._actions if a.dest != "help"}
    every = {f.name for kind in (ConsumerConfig, PartitionConfig, GroupConfig) for f in dataclasses.fields(kind)}
    assert offered == every - {"name", "group", "worker", "restart_after_crash"}
    args = parse("--batch-size", "7", "--pg-timeout", "0", "--register-interval", "30", "--strict-start")
    config = from_arguments("partitioned", args, name="p")
    assert (config.batch_size, config.pg_timeout, config.register_interval, config.strict_start) == (7, None, 30, True)
    assert from_arguments("group", parse(), group="g").batch_size == 1000, "the command line's default, as before"
    assert from_arguments("checkpoint", parse("--no-register"), name="c").register is False


def test_an_option_of_another_kind_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigurationError, match=r"--max-attempts: not a setting of a group consumer"):
        from_arguments("group", parse("--max-attempts", "2"), group="g")
    with pytest.raises(ConfigurationError, match=r"--max-deliveries: not a setting of a checkpoint consumer"):
        from_arguments("checkpoint", parse("--max-deliveries", "2"), name="c")


def test_the_shared_settings_are_declared_once() -> None:
    """Each setting of the three kinds is declared in ConsumeSettings or CheckpointSettings, or is the kind's own."""
    shared = {f.name for f in dataclasses.fields(ConsumeSettings)}
    for kind in (ConsumerConfig, PartitionConfig, GroupConfig):
        own = set(vars(kind).get("__annotations__", {}))
        assert own & shared <= {"batch_size", "block_ms"}, kind  # a kind may only change a shared default
