"""The schema registry (``unilog_schemas``, ``unilog_schema_modes``) and ``unilog schema`` on real Postgres.

The record type modules are in ``tests/contracts_fixtures/`` (one version of ``RideCreated`` each); every command
runs in its own process, as a user runs it, so each process knows one class per name and version.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import psycopg
import pytest
from cli import one_line, unilog

from unilog import Settings, store
from unilog.cli import ExitCode
from unilog.errors import ConfigurationError, SchemaIncompatible

F = "contracts_fixtures."


def schema(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return unilog(settings, "schema", *args)


def ok(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a command that succeeded printed on stdout."""
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout.splitlines()


def refused(result: subprocess.CompletedProcess[str], code: ExitCode = ExitCode.SCHEMA_INCOMPATIBLE) -> list[str]:
    """The lines a refused command printed on stderr (no traceback)."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.strip()]


def versions(pg: psycopg.Connection[Any]) -> list[tuple[str, int, str]]:
    rows = pg.execute("SELECT name, version, fingerprint FROM unilog_schemas ORDER BY name, version").fetchall()
    return [tuple(r) for r in rows]


@pytest.fixture
def registry(settings: Settings, pg: psycopg.Connection[Any]) -> Settings:
    # the contracts extra: the fixtures' modules are pydantic models
    pytest.importorskip("pydantic")
    return settings


def _row(version: int = 1, fingerprint: str = "sha256:aa") -> store.SchemaRow:
    schema_ = {"type": "object", "properties": {"ride_id": {"type": "string"}}, "required": ["ride_id"]}
    return store.SchemaRow("RideCreated", version, "rides", "ride", "created", schema_, fingerprint)


def test_the_store_registers_once_refuses_a_changed_version_and_keeps_modes(pg: psycopg.Connection[Any]) -> None:
    with pg.transaction():
        assert store.register(pg, _row()) is True
        assert store.register(pg, _row()) is False  # identical: idempotent
        with pytest.raises(SchemaIncompatible, match="bump the version to v2"):
            store.register(pg, _row(fingerprint="sha256:bb"))
    assert store.register(pg, _row(2, "sha256:cc")) is True
    rows = store.registered(pg, "RideCreated")
    assert [(r.version, r.fingerprint, r.stream, r.retired_at) for r in rows] == [
        (1, "sha256:aa", "rides", None),
        (2, "sha256:cc", "rides", None),
    ]
    assert rows[0].schema == _row().schema and rows[0].registered_at is not None
    assert store.registered(pg, "Other") == [] and len(store.registered(pg)) == 2

    assert store.stream_mode(pg, "rides") == "backward"
    store.set_stream_mode(pg, "rides", "full_transitive")
    assert (store.stream_mode(pg, "rides"), store.stream_mode(pg, "other")) == ("full_transitive", "backward")
    with pytest.raises(ConfigurationError, match="not a compatibility mode"):
        store.set_stream_mode(pg, "rides", "sideways")

    first = store.retire(pg, "RideCreated", 1)
    assert first is not None and first.retired_at is not None
    again = store.retire(pg, "RideCreated", 1)
    assert again is not None and again.retired_at == first.retired_at  # the first retirement stays
    assert store.retire(pg, "RideCreated", 9) is None
    assert store.registered(pg)[1].retired_at is None


def test_register_twice_registers_once(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    lines = ok(schema(registry, "register", F + "rides_v1", "--dry-run"))
    assert lines == [
        "unilog: would register RideCreated@1 on rides: new, nothing to compare with (no earlier version registered)"
    ]
    assert versions(pg) == []
    assert ok(schema(registry, "register", F + "rides_v1")) == [lines[0].replace("would register", "registered")]
    first = versions(pg)
    assert [(n, v) for n, v, _ in first] == [("RideCreated", 1)] and first[0][2].startswith("sha256:")
    assert ok(schema(registry, "register", F + "rides_v1")) == ["unilog: RideCreated v1: registered, unchanged"]
    assert versions(pg) == first


def test_a_changed_schema_under_a_registered_version_is_refused(
    registry: Settings, pg: psycopg.Connection[Any]
) -> None:
    ok(schema(registry, "register", F + "rides_v1"))
    before = versions(pg)
    for command in ("register", "check"):
        result = schema(registry, command, F + "rides_v1_changed")
        assert refused(result) == [one_line(result)]
        assert "RideCreated v1: the schema differs from the one registered as v1" in result.stderr
        assert "bump the version to v2" in result.stderr
    assert versions(pg) == before


def test_check_fails_with_one_line_per_breaking_change(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    ok(schema(registry, "register", F + "rides_v1"))
    result = schema(registry, "check", F + "rides_v2_required")
    lines = refused(result)
    assert len(lines) == 2, lines  # fare int -> text, city required without a default
    assert all(line.startswith("unilog: error: RideCreated v2 vs v1 (backward): ") for line in lines), lines
    assert any("'city'" in line for line in lines) and any("'fare'" in line for line in lines), lines
    assert "compatible" not in result.stdout
    # register runs the same check and registers nothing
    assert refused(schema(registry, "register", F + "rides_v2_required")) == lines
    assert [v for _, v, _ in versions(pg)] == [1]


def test_check_passes_a_compatible_version_with_a_line_per_type(
    registry: Settings, pg: psycopg.Connection[Any]
) -> None:
    ok(schema(registry, "register", F + "rides_v1"))
    assert ok(schema(registry, "check", F + "rides_v2_optional")) == [
        "unilog: RideCreated v2: compatible with v1 (backward)",
        "unilog: RideEnded v1: new, nothing to compare with (no earlier version registered)",
    ]
    assert versions(pg)[-1][1] == 1  # check registers nothing
    ok(schema(registry, "register", F + "rides_v2_optional"))
    assert [(n, v) for n, v, _ in versions(pg)] == [("RideCreated", 1), ("RideCreated", 2), ("RideEnded", 1)]


def test_an_upcaster_from_v1_satisfies_backward(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    ok(schema(registry, "register", F + "rides_v1"))
    lines = ok(schema(registry, "check", F + "rides_v2_upcast"))
    assert lines == ["unilog: RideCreated v2: compatible with v1 (backward), v1 read through upcaster"]
    # the same change without the upcaster breaks (test above: city required without a default); under full the
    # upcaster covers only the backward half, and adding a field is no forward break
    ok(schema(registry, "mode", "rides", "full"))
    lines = ok(schema(registry, "check", F + "rides_v2_upcast"))
    assert lines == ["unilog: RideCreated v2: compatible with v1 (full), v1 read through upcaster"]


def test_the_mode_is_per_stream(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    ok(schema(registry, "register", F + "rides_v1"))
    assert ok(schema(registry, "mode", "rides")) == ["unilog: stream rides: compatibility mode backward"]
    assert ok(schema(registry, "check", F + "rides_v2_dropped")) == [
        "unilog: RideCreated v2: compatible with v1 (backward)"
    ]
    assert ok(schema(registry, "mode", "rides", "forward")) == [
        "unilog: stream rides: compatibility mode forward (was backward)"
    ]
    assert ok(schema(registry, "mode", "rides")) == ["unilog: stream rides: compatibility mode forward"]
    assert ok(schema(registry, "mode", "other")) == ["unilog: stream other: compatibility mode backward"]
    result = schema(registry, "check", F + "rides_v2_dropped")
    line = one_line(result)
    assert result.returncode == ExitCode.SCHEMA_INCOMPATIBLE
    assert line.startswith("unilog: error: RideCreated v2 vs v1 (forward): ") and "'fare'" in line, line
    assert refused(schema(registry, "mode", "rides", "sideways"), ExitCode.USAGE)


def test_a_transitive_mode_compares_with_every_version_but_the_retired(
    registry: Settings, pg: psycopg.Connection[Any]
) -> None:
    ok(schema(registry, "register", F + "rides_v1"))
    ok(schema(registry, "register", F + "rides_v2_dropped"))
    assert ok(schema(registry, "check", F + "rides_v3_fare_text")) == [
        "unilog: RideCreated v3: compatible with v2 (backward)"  # the newest only
    ]
    ok(schema(registry, "mode", "rides", "backward_transitive"))
    line = one_line(result := schema(registry, "check", F + "rides_v3_fare_text"))
    assert result.returncode == ExitCode.SCHEMA_INCOMPATIBLE
    assert line.startswith("unilog: error: RideCreated v3 vs v1 (backward_transitive): ") and "'fare'" in line, line

    retired = ok(schema(registry, "retire", "RideCreated", "1"))
    assert retired == ["unilog: RideCreated v1 retired: compatibility checks no longer compare with it"]
    assert ok(schema(registry, "retire", "RideCreated", "1"))[0].startswith(
        "unilog: RideCreated v1 was retired already"
    )
    assert ok(schema(registry, "check", F + "rides_v3_fare_text")) == [
        "unilog: RideCreated v3: compatible with v2 (backward_transitive)"
    ]
    result = schema(registry, "retire", "RideCreated", "7")
    assert result.returncode == ExitCode.CONFIG and "RideCreated v7 is not registered" in one_line(result)


def test_list_and_show(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    assert ok(schema(registry, "list")) == ["unilog: no record types registered"]
    ok(schema(registry, "register", F + "rides_v1"))
    ok(schema(registry, "register", F + "rides_v2_optional"))
    ok(schema(registry, "retire", "RideCreated", "1"))
    lines = ok(schema(registry, "list"))
    assert [line.split("  ")[:3] for line in lines] == [
        ["RideCreated v1", "stream rides", "ride.created"],
        ["RideCreated v2", "stream rides", "ride.created"],
        ["RideEnded v1", "stream rides", "ride.ended"],
    ]
    assert ", retired " in lines[0] and "retired" not in lines[1]
    listed = json.loads("\n".join(ok(schema(registry, "list", "--json"))))
    assert [(e["name"], e["version"], e["stream"], e["object"], e["action"]) for e in listed] == [
        ("RideCreated", 1, "rides", "ride", "created"),
        ("RideCreated", 2, "rides", "ride", "created"),
        ("RideEnded", 1, "rides", "ride", "ended"),
    ]
    assert listed[0]["retired_at"] is not None and listed[1]["retired_at"] is None
    assert [e["fingerprint"] for e in listed] == [f for _, _, f in versions(pg)]

    newest = json.loads("\n".join(ok(schema(registry, "show", "RideCreated"))))
    assert set(newest["properties"]) == {"ride_id", "fare", "note"}
    first = json.loads("\n".join(ok(schema(registry, "show", "RideCreated", "--version", "1"))))
    assert set(first["properties"]) == {"ride_id", "fare"} and sorted(first["required"]) == ["fare", "ride_id"]
    for args in (("Nothing",), ("RideCreated", "--version", "5")):
        result = schema(registry, "show", *args)
        assert result.returncode == ExitCode.CONFIG and "is not registered" in one_line(result)


def test_a_module_that_cannot_be_used_is_one_line(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    for command in ("check", "register"):
        result = schema(registry, command, F + "broken")
        assert result.returncode == ExitCode.HANDLER, result.stderr
        assert "the settings module is missing" in one_line(result)
        result = schema(registry, command, F + "no_such_module")
        assert result.returncode == ExitCode.HANDLER and "no_such_module" in one_line(result)
        result = schema(registry, command, F + "no_types")
        assert result.returncode == ExitCode.CONFIG and "declares no record types" in one_line(result)
    assert versions(pg) == []


def test_an_unmigrated_database_is_exit_5(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    pg.execute("DROP TABLE unilog_alembic_version")
    for args in (("check", F + "rides_v1"), ("list",), ("mode", "rides")):
        result = schema(registry, *args)
        assert result.returncode == ExitCode.SCHEMA and "unilog migrate" in one_line(result)


def test_check_against_an_exported_registry_needs_no_database(
    registry: Settings, pg: psycopg.Connection[Any], tmp_path: Any
) -> None:
    """A CI job without the production database: ``export`` the registry once (schemas and modes), commit the file,
    and ``check --against`` it; the verdicts are the database's, mode included."""
    ok(schema(registry, "register", F + "rides_v1"))
    ok(schema(registry, "mode", "rides", "forward"))
    snapshot = tmp_path / "registry.json"
    assert ok(schema(registry, "export", "--out", str(snapshot))) == [
        f"unilog: wrote 1 registered versions to {snapshot}"
    ]
    exported = json.loads(snapshot.read_text())
    assert exported["modes"] == {"rides": "forward"} and exported["schemas"][0]["schema"]["required"]
    offline = registry.with_(database_url="postgresql://nobody@127.0.0.1:1/none")  # nothing listens there
    against = ("--against", str(snapshot))
    lines = refused(schema(offline, "check", F + "rides_v2_dropped", *against))
    assert lines == refused(schema(registry, "check", F + "rides_v2_dropped"))
    assert lines and all("(forward)" in line for line in lines), lines
    assert ok(schema(offline, "check", F + "rides_v2_optional", *against))[0].startswith("unilog: RideCreated v2: ")
    snapshot.write_text('{"schemas": [{"name": "x"}]}')
    [line] = refused(schema(offline, "check", F + "rides_v2_optional", *against), ExitCode.CONFIG)
    assert "not a registry exported by `unilog schema export`" in line


def test_versions_new_in_one_run_are_compared_with_each_other(registry: Settings, pg: psycopg.Connection[Any]) -> None:
    """``typed_records`` declares TypedRide v1, v2 and v3 (v3 adds ``surge``, required): on an empty registry, v3 is
    compared with the v2 beside it, not waved through as "nothing to compare with", and nothing is registered."""
    lines = refused(schema(registry, "register", "typed_records"))
    assert any(line.startswith("unilog: error: TypedRide v3 vs v2 (backward): field 'surge'") for line in lines), lines
    assert versions(pg) == []
