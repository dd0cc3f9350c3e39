"""unilog.contracts.compat: each rule in the direction it breaks and not in the other, the seven modes, transitive
against latest, and the upcaster exemption. Schemas are pydantic's own (validation mode), as contracts make them."""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import Any, Literal

import pydantic
import pytest

from unilog.contracts import compat, contract_of, record_type, upcaster
from unilog.errors import ConfigurationError


def schema(**fields: Any) -> dict[str, Any]:
    """The JSON Schema of a model named Ride with ``fields`` (name -> type, or (type, default))."""
    spec = {name: (kind if isinstance(kind, tuple) else (kind, ...)) for name, kind in fields.items()}
    model = pydantic.create_model("Ride", **spec)  # type: ignore[call-overload]
    return model.model_json_schema(mode="validation")


def lines(new: dict[str, Any], old: dict[str, Any], mode: str) -> list[str]:
    return compat.check(new, old, mode, name="Ride", new_version=2, old_version=1)


def breaks(new: dict[str, Any], old: dict[str, Any]) -> tuple[bool, bool]:
    """(breaks backward, breaks forward) for a change from ``old`` to ``new``."""
    return bool(lines(new, old, "backward")), bool(lines(new, old, "forward"))


def test_a_field_added_required_breaks_backward_with_the_specs_line() -> None:
    new, old = schema(ride_id=str, fare=int), schema(ride_id=str)
    assert lines(new, old, "backward") == [
        "Ride v2 vs v1 (backward): field 'fare' is required in v2 and absent in v1, with no default"
    ]
    assert lines(new, old, "forward") == []


def test_a_field_added_with_a_default_breaks_nothing() -> None:
    assert breaks(schema(ride_id=str, fare=(int, 0)), schema(ride_id=str)) == (False, False)


def test_a_required_field_removed_breaks_forward() -> None:
    new, old = schema(ride_id=str), schema(ride_id=str, fare=int)
    assert lines(new, old, "forward") == [
        "Ride v2 vs v1 (forward): field 'fare' is required in v1 and absent in v2, with no default"
    ]
    assert lines(new, old, "backward") == []


def test_a_field_with_a_default_removed_breaks_nothing() -> None:
    assert breaks(schema(ride_id=str), schema(ride_id=str, fare=(int, 0))) == (False, False)


def test_integer_widened_to_number_breaks_forward_only() -> None:
    new, old = schema(fare=float), schema(fare=int)
    assert breaks(new, old) == (False, True)
    assert lines(new, old, "forward") == [
        "Ride v2 vs v1 (forward): field 'fare': v2 writes number, v1 reads only integer"
    ]
    assert breaks(old, new) == (True, False)  # narrowed


def test_a_type_change_between_integer_and_string_breaks_both() -> None:
    new, old = schema(fare=str), schema(fare=int)
    assert lines(new, old, "backward") == [
        "Ride v2 vs v1 (backward): field 'fare': v1 writes integer, v2 reads only string"
    ]
    assert breaks(new, old) == (True, True)


def test_made_nullable_breaks_forward_and_made_required_breaks_backward() -> None:
    nullable, plain = schema(note=str | None), schema(note=str)
    assert breaks(nullable, plain) == (False, True)
    assert lines(nullable, plain, "forward") == [
        "Ride v2 vs v1 (forward): field 'note': v2 writes null, which v1 does not accept"
    ]
    assert breaks(plain, nullable) == (True, False)


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class MoreColour(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


def test_an_enum_value_added_breaks_forward_and_removed_breaks_backward() -> None:
    small, large = schema(colour=Colour), schema(colour=MoreColour)  # enums live in $defs, behind a $ref
    assert "$defs" in large
    assert breaks(large, small) == (False, True)
    assert lines(large, small, "forward") == [
        "Ride v2 vs v1 (forward): field 'colour': v2 writes 'blue', which v1 does not accept (one of 'red', 'green')"
    ]
    assert breaks(small, large) == (True, False)


def test_a_literal_is_an_enum() -> None:
    one, two = schema(kind=Literal["car"]), schema(kind=Literal["car", "bike"])
    assert breaks(two, one) == (False, True)
    assert breaks(one, two) == (True, False)
    assert breaks(schema(kind=str), one) == (False, True)  # widened to any string


class Fare(pydantic.BaseModel):
    amount: Decimal
    currency: str


class FareInt(pydantic.BaseModel):
    amount: Decimal
    currency: int


def test_nested_models_are_compared_through_their_refs_with_the_path() -> None:
    new, old = schema(fare=FareInt), schema(fare=Fare)
    assert lines(new, old, "backward") == [
        "Ride v2 vs v1 (backward): field 'fare.currency': v1 writes string, v2 reads only integer"
    ]
    assert breaks(schema(fare=Fare), schema(fare=Fare)) == (False, False)


def test_array_items_and_dict_values_are_compared() -> None:
    assert lines(schema(fares=list[FareInt]), schema(fares=list[Fare]), "backward") == [
        "Ride v2 vs v1 (backward): field 'fares[].currency': v1 writes string, v2 reads only integer"
    ]
    assert breaks(schema(tips=dict[str, float]), schema(tips=dict[str, int])) == (False, True)
    assert lines(schema(tips=dict[str, int]), schema(tips=dict[str, str]), "backward") == [
        "Ride v2 vs v1 (backward): field 'tips{}': v1 writes string, v2 reads only integer"
    ]


def test_a_tightened_constraint_breaks_backward() -> None:
    short = schema(code=pydantic.constr(max_length=3))
    assert breaks(short, schema(code=str)) == (True, False)
    assert lines(short, schema(code=str), "backward") == [
        "Ride v2 vs v1 (backward): field 'code': v2 requires maxLength 3, v1 writes maxLength unbounded"
    ]


def test_a_string_becoming_a_uuid_breaks_backward_on_its_format() -> None:
    import uuid

    assert breaks(schema(ride_id=uuid.UUID), schema(ride_id=str)) == (True, False)


def test_a_reader_that_forbids_extra_fields_breaks_on_a_written_field() -> None:
    class Strict(pydantic.BaseModel, extra="forbid"):
        a: int

    class Loose(pydantic.BaseModel):
        a: int
        b: int = 0

    new, old = Strict.model_json_schema(), Loose.model_json_schema()
    assert compat.check(new, old, "backward", name="R", new_version=2, old_version=1) == [
        "R v2 vs v1 (backward): field 'b' is written in v1 and v2 forbids fields it does not declare"
    ]


def test_full_reports_both_directions_and_none_nothing() -> None:
    new, old = schema(fare=str, tip=int), schema(fare=int)
    full = lines(new, old, "full")
    assert full == [
        "Ride v2 vs v1 (full: backward): field 'tip' is required in v2 and absent in v1, with no default",
        "Ride v2 vs v1 (full: backward): field 'fare': v1 writes integer, v2 reads only string",
        "Ride v2 vs v1 (full: forward): field 'fare': v2 writes string, v1 reads only integer",
    ]
    assert lines(new, old, "none") == []


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown compatibility mode 'BACKWARD'"):
        compat.check({}, {}, "BACKWARD")


# -- versions: transitive or latest, and upcasters --------------------------------------------------------------------

V1 = schema(ride_id=str, note=str)  # note is a string
V2 = schema(ride_id=str)  # note removed: backward-compatible
V3 = schema(ride_id=str, note=(int, 0))  # note back, as an integer: fine against v2, not against v1


def test_transitive_checks_every_older_version_and_plain_the_latest_only() -> None:
    registered = {1: V1, 2: V2}
    assert compat.check_versions("Ride", 3, V3, registered, "backward") == []
    assert compat.check_versions("Ride", 3, V3, registered, "backward_transitive") == [
        "Ride v3 vs v1 (backward_transitive): field 'note': v1 writes string, v3 reads only integer"
    ]
    assert compat.check_versions("Ride", 3, V3, registered, "full_transitive") == [
        "Ride v3 vs v1 (full_transitive: backward): field 'note': v1 writes string, v3 reads only integer",
        "Ride v3 vs v1 (full_transitive: forward): field 'note': v3 writes integer, v1 reads only string",
    ]


def test_forward_transitive_and_versions_at_or_above_the_new_one() -> None:
    registered = {1: V1, 2: V2, 3: V3, 4: V1}
    assert compat.check_versions("Ride", 3, V3, registered, "forward") == []  # against v2 only
    assert len(compat.check_versions("Ride", 3, V3, registered, "forward_transitive")) == 1
    assert compat.check_versions("Ride", 1, V3, registered, "full_transitive") == []
    assert compat.check_versions("Ride", 3, V3, registered, "none") == []


def test_an_upcaster_from_the_old_version_satisfies_backward_but_not_forward() -> None:
    new, old = schema(ride_id=str, fare=int), schema(ride_id=str, price=int)
    assert compat.check_versions("Ride", 2, new, {1: old}, "backward") != []
    assert compat.check_versions("Ride", 2, new, {1: old}, "backward", upcast_from={1}) == []
    assert compat.check_versions("Ride", 2, new, {1: old}, "full", upcast_from={1}) == [
        "Ride v2 vs v1 (full: forward): field 'price' is required in v1 and absent in v2, with no default"
    ]


def test_old_data_reaching_a_later_upcaster_must_read_as_that_version() -> None:
    v1 = schema(ride_id=int)
    v2 = schema(ride_id=str)  # v1's integers do not read as v2
    v3 = schema(key=str)  # an upcaster from v2 renames ride_id
    assert compat.upcast_start({2}, 1, 3) == 2 and compat.upcast_start({1, 2}, 1, 3) == 1
    assert compat.upcast_start({2}, 1, 2) is None
    assert compat.check_versions("Ride", 3, v3, {1: v1, 2: v2}, "backward_transitive", upcast_from={2}) == [
        "Ride v2 vs v1 (backward_transitive): field 'ride_id': v1 writes integer, v2 reads only string"
    ]
    assert (
        compat.check_versions("Ride", 3, v3, {1: schema(ride_id=str), 2: v2}, "backward_transitive", upcast_from={2})
        == []
    )


def test_check_contract_uses_the_contracts_schema_and_upcasters() -> None:
    @record_type(object="o", action="a", version=2, name="CompatFare")
    class CompatFare(pydantic.BaseModel):
        fare: int

    old = schema(price=int)
    contract = contract_of(CompatFare)
    assert compat.check_contract(contract, {1: old}) == [
        "CompatFare v2 vs v1 (backward): field 'fare' is required in v2 and absent in v1, with no default"
    ]

    @upcaster(CompatFare, from_version=1)
    def _rename(data: dict[str, Any]) -> dict[str, Any]:
        return {"fare": data["price"]}

    assert compat.check_contract(contract, {1: old}) == []
