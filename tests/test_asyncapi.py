"""The AsyncAPI 3.0 document of the log (``unilog asyncapi``): built on real servers from the registered record types,
a registered consumer and a consumer group, and valid under the official parser (``@asyncapi/parser`` v3 from npm,
run by tools/validate_asyncapi.mjs, which runs the validator the package ships, unilog/ops/validate_asyncapi.mjs); a
broken document fails that validator, so the check can fail. ``unilog asyncapi --validate`` runs the same validator
(tests/test_asyncapi_validate.py).

The parser is installed once into a cache folder outside the repository (``~/.cache/unilog-tests/asyncapi-parser``,
or ``$UNILOG_ASYNCAPI_PARSER_DIR``); without node and npm, or offline with nothing cached, those tests are skipped
saying why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

import psycopg
import pytest

from unilog import Settings
from unilog.cli import main
from unilog.contracts.asyncapi import MessageType, Reader, build_document

ROOT = Path(__file__).resolve().parent.parent
VALIDATOR = ROOT / "tools" / "validate_asyncapi.mjs"
PARSER = "@asyncapi/parser@3"


def _cache() -> Path:
    given = os.environ.get("UNILOG_ASYNCAPI_PARSER_DIR")
    if given:
        return Path(given)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "unilog-tests" / "asyncapi-parser"


@pytest.fixture(scope="session")
def parser_dir() -> Path:
    """The folder where ``@asyncapi/parser`` is installed (installed there on first use). Each suite worker may ask
    first on a fresh machine: one installs under a file lock, into a folder of its own that it renames into place,
    so no worker sees a half-installed parser (two concurrent installs into one folder failed with ENOTEMPTY, and a
    worker that saw the parser's own package.json ran it without its dependencies)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the official AsyncAPI parser (Node 20: apt-get install nodejs npm)")
    folder = _cache()
    if os.environ.get("UNILOG_ASYNCAPI_PARSER_DIR") and (folder / "node_modules" / "@asyncapi" / "parser").is_dir():
        return folder  # the user's own install: used as it is, never replaced
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / INSTALLED).is_file():
            _install(npm, folder)
    return folder


INSTALLED = ".unilog-installed"  # written last: the folder holds the parser and every dependency


def _install(npm: str, folder: Path) -> None:
    fresh = folder.with_name(f"{folder.name}.{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    result = subprocess.run(
        [npm, "install", "--prefix", str(fresh), "--no-audit", "--no-fund", "--loglevel=error", PARSER],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        pytest.skip(f"npm install {PARSER} failed (offline?): {result.stderr.strip()[-500:]}")
    (fresh / INSTALLED).write_text(PARSER)
    shutil.rmtree(folder, ignore_errors=True)  # a folder an interrupted install left, or one from before the marker
    fresh.rename(folder)


def validate(parser_dir: Path, document: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASYNCAPI_PARSER_DIR": str(parser_dir)}
    return subprocess.run(
        ["node", str(VALIDATOR), str(document)], capture_output=True, text=True, timeout=120, env=env, check=False
    )


RIDE = {
    "title": "RideCreated",
    "type": "object",
    "properties": {
        "ride_id": {"type": "string", "format": "uuid"},
        "fare": {"anyOf": [{"type": "number"}, {"type": "string", "pattern": "^-?\\d+(\\.\\d+)?$"}]},
        "pickup": {"$ref": "#/$defs/Place"},
        "stops": {"type": "array", "items": {"$ref": "#/$defs/Place"}},
    },
    "required": ["ride_id", "fare", "pickup"],
    "$defs": {"Place": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}}},
}
PAID = {  # another "Place": not the same schema, so they cannot share the name
    "type": "object",
    "properties": {
        "where": {"$ref": "#/$defs/Place"},
        "method": {
            "discriminator": {"propertyName": "kind", "mapping": {"card": "#/$defs/Card"}},
            "oneOf": [{"$ref": "#/$defs/Card"}],
        },
    },
    "$defs": {
        "Place": {"type": "string"},
        "Card": {"type": "object", "properties": {"kind": {"const": "card", "type": "string"}}, "required": ["kind"]},
    },
}


def hand_made() -> dict[str, Any]:
    types = [
        MessageType("RideCreated", 1, "rides", "ride", "created", RIDE, "sha256:01", retired=True),
        MessageType("RideCreated", 2, "rides", "ride", "created", RIDE, "sha256:02"),
        MessageType("Paid", 1, "", "payment", "paid", PAID, None, registered=False),
    ]
    readers = [Reader("rides", "totals"), Reader("rides", "billing", "group"), Reader("", "audit")]
    return build_document(
        types, title="Rides", version="2.1.0", default_stream="main", streams=["ops:events"],
        readers=readers, partitions={"rides": 4},
    )  # fmt: skip


def test_the_builder_puts_types_on_their_streams_and_readers_as_operations() -> None:
    doc = hand_made()
    assert doc["asyncapi"] == "3.0.0" and doc["info"]["title"] == "Rides" and doc["info"]["version"] == "2.1.0"
    assert set(doc["channels"]) == {"main", "ops_events", "rides"}
    rides = doc["channels"]["rides"]
    assert rides["address"] == "rides.p{partition}" and rides["parameters"]["partition"]["enum"] == ["0", "1", "2", "3"]
    assert doc["channels"]["ops_events"]["address"] == "ops:events" and doc["channels"]["ops_events"]["messages"] == {}
    assert rides["messages"] == {
        "RideCreated_v1": {"$ref": "#/components/messages/RideCreated_v1"},
        "RideCreated_v2": {"$ref": "#/components/messages/RideCreated_v2"},
    }
    message = doc["components"]["messages"]["RideCreated_v2"]
    assert (message["name"], message["title"]) == ("RideCreated", "RideCreated v2")
    assert message["x-unilog-type"] == "RideCreated@2" and message["x-unilog-fingerprint"] == "sha256:02"
    assert message["headers"]["properties"]["type"]["const"] == "RideCreated@2"
    assert doc["components"]["messages"]["RideCreated_v1"]["x-unilog-retired"] is True
    assert doc["components"]["messages"]["Paid_v1"]["x-unilog-registered"] is False
    ops = doc["operations"]
    assert ops["rides.publish"]["action"] == "send" and ops["rides.publish"]["channel"] == {"$ref": "#/channels/rides"}
    assert ops["rides.consumer.totals"]["action"] == ops["rides.group.billing"]["action"] == "receive"
    assert ops["main.consumer.audit"]["messages"] == [{"$ref": "#/channels/main/messages/Paid_v1"}]


def test_the_builder_moves_defs_into_components_and_every_ref_resolves() -> None:
    doc = hand_made()
    schemas = doc["components"]["schemas"]
    paid = doc["components"]["messages"]["Paid_v1"]["payload"]  # the first by name: its "Place" keeps the name
    assert "$defs" not in paid and paid["properties"]["where"] == {"$ref": "#/components/schemas/Place"}
    assert schemas["Place"] == {"type": "string"}
    ride = doc["components"]["messages"]["RideCreated_v2"]["payload"]
    assert ride["properties"]["pickup"] == {"$ref": "#/components/schemas/RideCreated_v2.Place"}, "a clash: prefixed"
    assert schemas["RideCreated_v2.Place"]["properties"]["lat"] == {"type": "number"}
    assert paid["properties"]["method"]["discriminator"] == "kind"
    text = json.dumps(doc)
    for ref in {r for r in _refs(doc)}:
        node: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        assert node, ref
    assert "#/$defs/" not in text


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_the_hand_made_document_is_valid_and_a_broken_one_is_not(parser_dir: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(hand_made()))
    result = validate(parser_dir, good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid AsyncAPI 3.0.0" in result.stdout
    broken = hand_made()
    del broken["info"]["version"]
    ops = broken["operations"]
    ops["rides.publish"]["messages"] = [{"$ref": "#/channels/main/messages/Paid_v1"}]  # not the channel's message
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    result = validate(parser_dir, bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'must have required property "version"' in result.stdout
    assert "asyncapi3-operation-messages-from-referred-channel" in result.stdout


# real pydantic output for the registry's rows: Decimal, UUID, datetime, a nested model, a tagged union, optionals
def pydantic_schemas() -> dict[str, dict[str, Any]]:
    from pydantic import BaseModel, Field, TypeAdapter

    class Place(BaseModel):
        lat: float
        lon: float

    class Card(BaseModel):
        kind: Literal["card"] = "card"
        last4: str

    class Cash(BaseModel):
        kind: Literal["cash"] = "cash"

    class RideCreated(BaseModel):
        ride_id: UUID
        fare: Decimal = Field(description="in euros, exact")
        pickup: Place
        stops: list[Place] = []
        at: datetime
        note: str | None = None

    class Paid(BaseModel):
        ride_id: UUID
        amount: Decimal
        method: Card | Cash = Field(discriminator="kind")

    return {name: TypeAdapter(cls).json_schema() for name, cls in (("RideCreated", RideCreated), ("Paid", Paid))}


def register(
    conn: psycopg.Connection[Any], name: str, version: int, stream: str, obj: str, act: str, schema: Any
) -> None:
    from unilog.store import schemas

    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    fingerprint = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    schemas.register(conn, schemas.SchemaRow(name, version, stream, obj, act, schema, fingerprint))


@pytest.fixture
def log(settings: Settings) -> Settings:
    """Two versions of RideCreated on ``rides`` (v1 retired), Paid on the default stream, a checkpoint consumer, a
    consumer registered in Redis and a consumer group on ``rides``."""
    from unilog import engine
    from unilog.store import schemas

    found = pydantic_schemas()
    with psycopg.connect(settings.conninfo) as conn:
        register(conn, "RideCreated", 1, "rides", "ride", "created", {**found["RideCreated"], "required": ["ride_id"]})
        register(conn, "RideCreated", 2, "rides", "ride", "created", found["RideCreated"])
        register(conn, "Paid", 1, "", "ride", "paid", found["Paid"])
        schemas.retire(conn, "RideCreated", 1)
        conn.execute("INSERT INTO unilog_checkpoints (name, stream) VALUES ('totals', 'rides')")
    api = engine.RedisStreams(engine.connect(settings.redis_url))
    try:
        api.register("rides", "audit", "0-0")
        api.ensure_group("rides", "billing")
    finally:
        api.close()
    return settings


def urls(settings: Settings) -> list[str]:
    return [
        "--database-url",
        settings.database_url,
        "--redis-url",
        settings.redis_url,
        "--default-stream",
        settings.stream,
    ]


def test_the_logs_document_is_valid_under_the_official_parser(log: Settings, parser_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "log.asyncapi.json"
    assert main(["asyncapi", "--out", str(out), "--title", "Rides", *urls(log)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["channels"]) == {"rides", log.stream}
    assert set(doc["channels"]["rides"]["messages"]) == {"RideCreated_v1", "RideCreated_v2"}
    assert set(doc["channels"][log.stream]["messages"]) == {"Paid_v1"}
    assert doc["components"]["messages"]["RideCreated_v1"]["x-unilog-retired"] is True
    assert {k: op["action"] for k, op in doc["operations"].items() if k.startswith("rides.")} == {
        "rides.publish": "send",
        "rides.consumer.totals": "receive",
        "rides.consumer.audit": "receive",
        "rides.group.billing": "receive",
    }
    assert {"Place", "Card", "Cash"} <= set(doc["components"]["schemas"]), "pydantic's $defs moved"
    result = validate(parser_dir, out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not [line for line in result.stdout.splitlines() if line.startswith(("error", "warning"))], result.stdout


def test_module_contracts_not_registered_yet_are_in_the_document(log: Settings, tmp_path: Path) -> None:
    """``--module``: the module's types beside the registered ones (a new version, a new type), marked unregistered;
    run as a process, as the module's classes may be declared once per process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "doc.json"
    module = "contracts_fixtures.rides_v2_optional"  # RideCreated v2 (registered here already) and RideEnded v1
    result = subprocess.run(
        [sys.executable, "-m", "unilog", "asyncapi", "--out", str(out), "--module", module, *urls(log)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    messages = json.loads(out.read_text())["components"]["messages"]
    assert messages["RideEnded_v1"]["x-unilog-registered"] is False
    assert messages["RideCreated_v2"]["x-unilog-registered"] is True, "the registered version wins"
