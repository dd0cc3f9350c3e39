"""Record contracts, the pure core (no servers): declaring a type, encoding with a real validation, decoding through
upcasters, the errors' fields and one-line messages, fingerprints, and finding contracts in a module."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
import textwrap
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pydantic
import pytest

from unilog.contracts import Contract, all_contracts, contract_of, contracts_in, record_type, upcaster
from unilog.errors import (
    ConfigurationError,
    HandlerNotFound,
    InvalidRecord,
    RecordContractViolation,
    UnknownRecordVersion,
    UnreadableRecord,
)

ROOT = Path(__file__).resolve().parent.parent
RIDE = uuid.UUID("6f1c2a52-4a53-4f4e-9a43-0d1f6f1b2c3d")
AT = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


class Item(pydantic.BaseModel):
    price: Decimal


@record_type(stream="rides", object="ride", action="created", version=2, key="ride_id")
class RideCreated(pydantic.BaseModel):
    ride_id: uuid.UUID
    rider: str
    amount: Decimal
    distance: float | None = None
    at: dt.datetime
    items: list[Item] = []


@record_type(object="ride", action="paid", name="RidePaidDC")
@dataclasses.dataclass
class RidePaid:
    ride_id: uuid.UUID
    amount: Decimal
    at: dt.datetime


def _ride(**changes: Any) -> RideCreated:
    fields: dict[str, Any] = {"ride_id": RIDE, "rider": "ann", "amount": Decimal("12.30"), "at": AT}
    return RideCreated(**{**fields, **changes})


# -- declaring --------------------------------------------------------------------------------------------------------


def test_record_type_returns_the_class_with_its_contract_registered() -> None:
    contract = RideCreated.__unilog_contract__  # type: ignore[attr-defined]
    assert isinstance(contract, Contract)
    assert (contract.name, contract.version, contract.stream, contract.object, contract.action) == (
        "RideCreated",
        2,
        "rides",
        "ride",
        "created",
    )
    assert contract.cls is RideCreated and contract.key_field == "ride_id" and contract.type_tag == "RideCreated@2"
    assert contract_of(RideCreated) is contract is contract_of(_ride())
    assert contract in all_contracts()
    paid = contract_of(RidePaid)
    assert (paid.name, paid.version, paid.stream, paid.key_field) == ("RidePaidDC", 1, None, None)


def test_the_key_is_the_key_fields_str() -> None:
    assert contract_of(RideCreated).key_of(_ride()) == str(RIDE)
    assert contract_of(RidePaid).key_of(RidePaid(RIDE, Decimal(1), AT)) is None


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"name": "1ride"}, "type name '1ride'"),
        ({"name": "ride created"}, "type name 'ride created'"),
        ({"name": "R" * 101}, "must match"),
        ({"version": 0}, "version must be an int >= 1, got 0"),
        ({"version": True}, "version must be an int >= 1, got True"),
        ({"version": "2"}, "version must be an int >= 1, got '2'"),
        ({"key": "nope"}, "key 'nope' is not a field of Bad (fields: n)"),
        ({"stream": "no spaces"}, "invalid stream name 'no spaces'"),
        ({"object": ""}, "object must be a non-empty string"),
    ],
)
def test_a_bad_declaration_is_one_configuration_error_line(kwargs: dict[str, Any], says: str) -> None:
    arguments = {"object": "o", "action": "a", "name": "BadDeclaration", **kwargs}
    with pytest.raises(ConfigurationError) as caught:

        @record_type(**arguments)
        class Bad(pydantic.BaseModel):
            n: int

    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert ("BadDeclaration", arguments.get("version", 1)) not in {(c.name, c.version) for c in all_contracts()}


def test_only_models_and_dataclasses_can_be_declared() -> None:
    with pytest.raises(ConfigurationError, match="decorate a pydantic BaseModel or a dataclass"):

        @record_type(object="o", action="a", name="PlainClass")
        class Plain:
            n: int


def test_a_second_class_with_the_same_name_and_version_is_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:

        @record_type(object="ride", action="created", version=2)
        class RideCreated(pydantic.BaseModel):  # another class, same name and version
            ride_id: uuid.UUID

    assert "RideCreated v2 is declared twice" in str(caught.value)
    assert contract_of(globals()["RideCreated"]).cls is globals()["RideCreated"]


def test_the_same_class_declared_again_replaces_itself() -> None:
    again = record_type(stream="rides", object="ride", action="created", version=2, key="ride_id")(RideCreated)
    assert again is RideCreated and contract_of(RideCreated).version == 2


def test_an_undeclared_class_or_a_subclass_has_no_contract() -> None:
    class Child(RideCreated):
        pass

    for cls in (Item, Child):
        with pytest.raises(ConfigurationError, match=f"{cls.__qualname__} is not a record type"):
            contract_of(cls)


# -- encoding ---------------------------------------------------------------------------------------------------------


def test_encode_writes_exact_decimals_uuids_and_iso_datetimes() -> None:
    text = contract_of(RideCreated).encode(_ride(items=[Item(price=Decimal("0.10"))]))
    data = json.loads(text)
    assert data == {
        "ride_id": str(RIDE),
        "rider": "ann",
        "amount": "12.30",
        "distance": None,
        "at": "2024-05-01T12:00:00Z",
        "items": [{"price": "0.10"}],
    }
    assert dt.datetime.fromisoformat(data["at"]) == AT


def test_decimals_round_trip_exactly_digits_and_exponent() -> None:
    contract = contract_of(RideCreated)
    for amount in ("12.30", "0.33333333333333333333", "1E+3", "-0.00"):
        back = contract.decode(contract.encode(_ride(amount=Decimal(amount))))
        assert str(back.amount) == amount and isinstance(back.amount, Decimal)


def test_a_dataclass_encodes_and_decodes_the_same_way() -> None:
    contract = contract_of(RidePaid)
    paid = RidePaid(RIDE, Decimal("7.50"), AT)
    text = contract.encode(paid)
    assert json.loads(text) == {"ride_id": str(RIDE), "amount": "7.50", "at": "2024-05-01T12:00:00Z"}
    assert contract.decode(text) == paid


def _refused(instance: object, contract: Contract | None = None) -> RecordContractViolation:
    with pytest.raises(RecordContractViolation) as caught:
        (contract or contract_of(RideCreated)).encode(instance)
    assert isinstance(caught.value, InvalidRecord) and "\n" not in str(caught.value)
    return caught.value


def test_a_field_changed_after_construction_is_refused_naming_field_and_rule() -> None:
    ride = _ride()
    ride.amount = "lots"  # type: ignore[assignment]
    refused = _refused(ride)
    assert (refused.field, refused.rule) == ("amount", "decimal_parsing")
    assert str(refused) == "RideCreated v2: field 'amount': Input should be a valid decimal (rule decimal_parsing)"


def test_model_construct_with_a_bad_value_or_a_missing_field_is_refused() -> None:
    refused = _refused(RideCreated.model_construct(ride_id="not-a-uuid", rider="ann", amount=Decimal(1), at=AT))
    assert (refused.field, refused.rule) == ("ride_id", "uuid_parsing")
    refused = _refused(RideCreated.model_construct(ride_id=RIDE, amount=Decimal(1), at=AT))
    assert (refused.field, refused.rule) == ("rider", "missing")


def test_a_nested_bad_value_is_named_by_its_path() -> None:
    refused = _refused(_ride(items=[Item(price=Decimal(1)), Item.model_construct(price="x")]))
    assert (refused.field, refused.rule) == ("items[1].price", "decimal_parsing")
    refused = _refused(_ride(items=[Item.model_construct(price=object())]))
    assert (refused.field, refused.rule) == ("items[0].price", "decimal_type")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_not_written_as_null(bad: float) -> None:
    refused = _refused(_ride(distance=bad))
    assert (refused.field, refused.rule) == ("distance", "finite_number")


def test_a_nan_decimal_is_refused() -> None:
    assert _refused(_ride(amount=Decimal(1)).model_copy(update={"amount": Decimal("NaN")})).field == "amount"


def test_a_nul_character_or_a_lone_surrogate_is_refused() -> None:
    refused = _refused(_ride(rider="a\x00b"))
    assert (refused.field, refused.rule) == ("rider", "no_nul_character")
    assert "\x00" not in str(refused)
    refused = _refused(_ride(rider="a\ud800b"))
    assert (refused.field, refused.rule) == ("rider", "string_unicode")


def test_an_instance_of_another_class_is_refused() -> None:
    refused = _refused({"ride_id": str(RIDE)})
    assert (refused.field, refused.rule) == ("", "model_type")
    assert str(refused) == "RideCreated v2: expected an instance of RideCreated, got dict (rule model_type)"
    refused = _refused(_ride(), contract_of(RidePaid))
    assert refused.rule == "dataclass_type"


def test_a_dataclass_changed_after_construction_is_refused() -> None:
    paid = RidePaid(RIDE, Decimal(1), AT)
    paid.at = "yesterday"  # type: ignore[assignment]
    refused = _refused(paid, contract_of(RidePaid))
    assert refused.field == "at" and refused.rule.startswith("datetime")


# -- decoding ---------------------------------------------------------------------------------------------------------


def test_data_that_does_not_validate_is_unreadable_naming_field_and_rule() -> None:
    contract = contract_of(RideCreated)
    text = contract.encode(_ride()).replace('"12.30"', '"twelve"')
    with pytest.raises(UnreadableRecord) as caught:
        contract.decode(text)
    assert (
        caught.value.reason == "RideCreated v2: field 'amount': Input should be a valid decimal (rule decimal_parsing)"
    )
    with pytest.raises(UnreadableRecord, match=r"rule json_invalid"):
        contract.decode(b"{not json")


@record_type(object="fare", action="set", version=3, name="FareSet")
class FareSet(pydantic.BaseModel):
    ride_id: str
    fare: Decimal
    currency: str
    history: list[str] = []


@upcaster(FareSet, from_version=1)
def _fare_v1(data: dict[str, Any]) -> dict[str, Any]:  # v1 called the fare "price"
    data = dict(data)
    data["fare"] = data.pop("price")
    data["history"] = [*data.get("history", []), "v1"]
    return data


@upcaster(FareSet, from_version=2)
def _fare_v2(data: dict[str, Any]) -> dict[str, Any]:  # v3 added the currency, with no default
    return {**data, "currency": "EUR", "history": [*data.get("history", []), "v2"]}


def test_a_v1_record_is_read_through_the_upcasters_in_order() -> None:
    fare = contract_of(FareSet).decode('{"ride_id": "r1", "price": "9.90"}', 1)
    assert fare == FareSet(ride_id="r1", fare=Decimal("9.90"), currency="EUR", history=["v1", "v2"])
    assert str(fare.fare) == "9.90"


def test_a_v2_record_goes_through_the_last_upcaster_only() -> None:
    fare = contract_of(FareSet).decode(b'{"ride_id": "r1", "fare": "1.00"}', 2)
    assert fare.history == ["v2"] and fare.currency == "EUR"


def test_the_current_version_or_none_reads_as_it_is() -> None:
    text = '{"ride_id": "r1", "fare": "1.00", "currency": "USD"}'
    assert (
        contract_of(FareSet).decode(text, 3) == contract_of(FareSet).decode(text) == FareSet.model_validate_json(text)
    )


def test_a_version_without_an_upcaster_is_validated_as_it_is() -> None:
    @record_type(object="o", action="a", version=2, name="NoUpcasterNeeded")
    class Added(pydantic.BaseModel):
        n: int
        note: str = ""

    assert contract_of(Added).decode('{"n": 1}', 1) == Added(n=1)
    with pytest.raises(UnreadableRecord) as caught:
        contract_of(Added).decode('{"m": 1}', 1)
    assert caught.value.reason == "NoUpcasterNeeded v2 (read from v1): field 'n': Field required (rule missing)"


def test_an_upcaster_that_raises_makes_the_record_unreadable() -> None:
    with pytest.raises(UnreadableRecord, match=r"^FareSet v1 -> v2: the upcaster raised KeyError: 'price'"):
        contract_of(FareSet).decode('{"ride_id": "r1"}', 1)


def test_a_newer_version_is_unknown_with_its_numbers() -> None:
    with pytest.raises(UnknownRecordVersion) as caught:
        contract_of(FareSet).decode('{"ride_id": "r1"}', 4)
    error = caught.value
    assert isinstance(error, UnreadableRecord)
    assert (error.name, error.version, error.newest) == ("FareSet", 4, 3)
    assert (
        str(error)
        == error.reason
        == (
            "FareSet v4 is newer than v3, the newest this consumer knows: upgrade it "
            "(the record stays in the dead letters for a replay)"
        )
    )


@pytest.mark.parametrize("version", [0, -1, True])
def test_a_version_below_one_is_unreadable(version: int) -> None:
    with pytest.raises(UnreadableRecord, match="is not an int >= 1") as caught:
        contract_of(FareSet).decode("{}", version)
    assert not isinstance(caught.value, UnknownRecordVersion)


@pytest.mark.parametrize(("from_version", "says"), [(3, "from 1 to 2, got 3"), (0, "got 0")])
def test_an_upcaster_outside_the_types_versions_is_refused(from_version: int, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        upcaster(FareSet, from_version=from_version)


def test_a_second_upcaster_for_one_step_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"FareSet v1 -> v2 is declared twice"):

        @upcaster(FareSet, from_version=1)
        def other(data: dict[str, Any]) -> dict[str, Any]:
            return data

    assert contract_of(FareSet).upcasters[1] is _fare_v1


# -- schema and fingerprint -------------------------------------------------------------------------------------------


def test_the_json_schema_is_the_validation_view_and_a_copy() -> None:
    contract = contract_of(FareSet)
    schema = contract.json_schema()
    assert schema == FareSet.model_json_schema(mode="validation")
    assert set(schema["required"]) == {"ride_id", "fare", "currency"}  # history has a default
    schema["required"].clear()
    assert contract.json_schema()["required"]


def test_the_fingerprint_is_sha256_of_the_canonical_schema() -> None:
    import hashlib

    contract = contract_of(RideCreated)
    canonical = json.dumps(RideCreated.model_json_schema(), sort_keys=True, separators=(",", ":"))
    assert contract.fingerprint() == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_equal_schemas_equal_fingerprints_and_a_change_changes_it() -> None:
    def declare(name: str, kind: type) -> Contract:
        @record_type(object="o", action="a", name=name)
        class Shape(pydantic.BaseModel):
            n: kind  # type: ignore[valid-type]

        return contract_of(Shape)

    assert declare("ShapeA", int).fingerprint() == declare("ShapeB", int).fingerprint()
    assert declare("ShapeC", int).fingerprint() != declare("ShapeD", str).fingerprint()


def test_the_fingerprint_is_the_same_in_another_process() -> None:
    code = "import tests.test_contracts as t; print(t.contract_of(t.RideCreated).fingerprint())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "123"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == contract_of(RideCreated).fingerprint()


# -- finding contracts ------------------------------------------------------------------------------------------------


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    for relative, code in modules.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))


RECORD = """
import pydantic
from unilog.contracts import record_type

@record_type(object="o", action="a", name="{name}")
class {name}(pydantic.BaseModel):
    n: int
"""


def test_contracts_in_a_package_include_its_submodules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(
        tmp_path,
        "ctpkg",
        {
            "__init__.py": RECORD.format(name="CtTop"),
            "sub/__init__.py": "",
            "sub/deep.py": RECORD.format(name="CtDeep"),
            "other.py": "X = 1\n",
        },
    )
    _package(tmp_path, "ctelse", {"__init__.py": RECORD.format(name="CtElsewhere")})
    monkeypatch.syspath_prepend(str(tmp_path))
    contracts_in("ctelse")
    assert [c.name for c in contracts_in("ctpkg")] == ["CtDeep", "CtTop"]
    assert [c.name for c in contracts_in("ctpkg.sub.deep")] == ["CtDeep"]


def test_a_module_that_does_not_import_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(tmp_path, "ctbroken", {"__init__.py": "", "bad.py": "raise RuntimeError('no\\ndatabase')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HandlerNotFound) as caught:
        contracts_in("ctbroken")
    assert str(caught.value) == "cannot import 'ctbroken.bad': RuntimeError: no database"
    with pytest.raises(HandlerNotFound, match="cannot import 'ct_missing': ModuleNotFoundError"):
        contracts_in("ct_missing")


def test_importing_unilog_does_not_import_pydantic() -> None:
    code = "import sys, unilog, unilog.errors; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class Leg(pydantic.BaseModel):
    km: float | None = None


@record_type(object="trip", action="made", name="TripMade")
class TripMade(pydantic.BaseModel):
    legs: list[Leg]
    stops: int | None = None


def test_a_nan_nested_in_a_nullable_float_or_put_in_a_nullable_int_is_refused() -> None:
    contract = contract_of(TripMade)
    assert json.loads(contract.encode(TripMade(legs=[Leg(km=1.5), Leg()]))) == {
        "legs": [{"km": 1.5}, {"km": None}],
        "stops": None,
    }
    refused = _refused(TripMade(legs=[Leg(km=1.0), Leg(km=float("nan"))]), contract)
    assert (refused.field, refused.rule) == ("legs[1].km", "finite_number")
    trip = TripMade(legs=[])
    trip.stops = float("inf")  # type: ignore[assignment]
    assert _refused(trip, contract).field == "stops"


def test_a_json_number_in_a_decimal_field_is_read_with_every_digit() -> None:
    """unilog writes Decimals as strings, but ``unilog_emit`` and json columns give numbers: pydantic alone reads
    them through a float (1.10 became 1.1); a time's fractional seconds in a string is not mistaken for one."""
    import datetime as dt

    @record_type(object="fare", action="set", version=1, name="ExactFare")
    class ExactFare(pydantic.BaseModel):
        amount: Decimal
        parts: list[Decimal] = []
        at: dt.datetime = dt.datetime(2026, 1, 1)

    contract = contract_of(ExactFare)
    for text in ("1.10", "0.1234567890123456789", "12345678901234567890.123456789", "-2.50E+3", '"12.30"', "7"):
        expected = Decimal(text.strip('"'))
        for raw in (
            f'{{"amount": {text}, "parts": [{text},{text}]}}',
            f'{{"amount":{text},"at":"2026-01-01T10:20:50.31"}}',
        ):
            for given in (raw, raw.encode()):
                read = contract.decode(given)
                assert str(read.amount) == str(expected) and all(str(p) == str(expected) for p in read.parts), raw
