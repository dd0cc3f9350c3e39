"""``typed-codec``: microseconds per record of encoding and decoding bench.rides' six-field record, no I/O.

Issue 37 asks for "msgspec or pydantic-core, whichever is faster, measured". In one fresh process, over a pool of
1,000 records (best of 5 passes, ``typed_reps`` trials):

* ``pydantic encode+validate``: what ``emit`` of a typed record runs (``Contract.encode``: serialize, then validate
  the JSON text with the type's validator); ``pydantic encode``: the serialization alone;
* ``pydantic decode``: what a typed consumer runs per record (``Contract.decode``: validate the JSON into an
  instance);
* ``msgspec ...``: the same with a ``msgspec.Struct`` of the same fields (encode, then decode with the type, as
  unilog validates the text it stages); ``msgspec on the pydantic instance``: msgspec encoding the
  pydantic instance (an ``enc_hook`` handing it the instance's ``__dict__``) and validating through the Struct, what
  unilog would run if it kept pydantic classes and used msgspec underneath;
* the untyped path for reference: ``dict encode`` (``unilog.produce.encoding.encode_data``, emit's encoding of a
  dict), ``json.loads`` (``record.data``), and ``emit prepare`` of each (all of emit but the statement), and
  ``model construction`` (``BenchRide(**fields)``, the application's own cost of a typed record).

msgspec is not a dependency of unilog: where it is not installed its variants are left out (and logged).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from unilog.produce.encoding import encode_data
from unilog.produce.records import DEFAULT_RULES, NO_DATA, prepare

from .core import Measurement, Profile, Results, in_fresh_process, log
from .rides import BenchRide, ride, ride_fields

PASSES = 5
CASE = "6 fields, per record"

try:
    import msgspec

    class RideStruct(msgspec.Struct):
        """bench.rides.BenchRide's fields as a msgspec Struct."""

        ride_id: uuid.UUID
        rider: str
        fare: Decimal
        requested_at: dt.datetime
        passengers: int
        city: str

except ImportError:  # pragma: no cover - an optional comparison
    msgspec = None  # type: ignore[assignment]


def per_record_us(fn: Callable[[Any], Any], items: list[Any]) -> float:
    """Best of ``PASSES`` passes of ``fn`` over ``items``, in microseconds per item."""
    best = float("inf")
    for _ in range(PASSES):
        started = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - started)
    return best / len(items) * 1e6


def _pydantic_cases(rides: list[Any], fields: list[dict[str, Any]]) -> dict[str, Callable[[], float]]:
    contract = BenchRide.__unilog_contract__  # type: ignore[attr-defined]
    serializer = contract._codec.serializer
    texts = [contract.encode(r) for r in rides]
    dict_texts = [encode_data(f) for f in fields]

    def prepare_dict(f: dict[str, Any]) -> Any:
        return prepare(DEFAULT_RULES, None, "created", "ride", f, None, str(f["ride_id"]), None)

    return {
        "pydantic encode+validate": lambda: per_record_us(contract.encode, rides),
        "pydantic encode": lambda: per_record_us(lambda r: serializer.to_json(r, by_alias=True), rides),
        "pydantic decode": lambda: per_record_us(contract.decode, texts),
        "dict encode (untyped emit)": lambda: per_record_us(encode_data, fields),
        "json.loads (record.data)": lambda: per_record_us(json.loads, dict_texts),
        "emit prepare, typed": lambda: per_record_us(
            lambda r: prepare(DEFAULT_RULES, r, None, None, NO_DATA, None, None, None), rides
        ),
        "emit prepare, dict": lambda: per_record_us(prepare_dict, fields),
        "model construction": lambda: per_record_us(lambda f: BenchRide(**f), fields),
    }


def _msgspec_cases(rides: list[Any], fields: list[dict[str, Any]]) -> dict[str, Callable[[], float]]:
    if msgspec is None:
        return {}
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder(RideStruct)
    hooked = msgspec.json.Encoder(enc_hook=lambda obj: obj.__dict__)
    structs = [RideStruct(**f) for f in fields]
    texts = [encoder.encode(s) for s in structs]

    def struct_round_trip(s: Any) -> bytes:
        text = encoder.encode(s)
        decoder.decode(text)
        return text

    def model_round_trip(r: Any) -> bytes:
        text = hooked.encode(r)
        decoder.decode(text)
        return text

    return {
        "msgspec encode+validate": lambda: per_record_us(struct_round_trip, structs),
        "msgspec encode": lambda: per_record_us(encoder.encode, structs),
        "msgspec decode": lambda: per_record_us(decoder.decode, texts),
        "msgspec on the pydantic instance": lambda: per_record_us(model_round_trip, rides),
    }


def _measure() -> tuple[dict[str, float], str | None]:
    """In a fresh process: every case once (each the best of its passes)."""
    fields = [ride_fields(i) for i in range(1000)]
    rides = [ride(i) for i in range(1000)]
    cases = {**_pydantic_cases(rides, fields), **_msgspec_cases(rides, fields)}
    version = None if msgspec is None else msgspec.__version__
    return {name: run() for name, run in cases.items()}, version


def run_codecs(profile: Profile, results: Results) -> None:
    log(f"typed-codec: {profile.typed_reps} trials of encoding/decoding 1,000 records (best of {PASSES} passes)")
    for rep in range(profile.typed_reps):
        figures, version = in_fresh_process(_measure)
        if version is None and rep == 0:
            log("  typed-codec: msgspec is not installed; its variants are left out (pip install msgspec)")
        for name, us in figures.items():
            notes = {"msgspec": version} if name.startswith("msgspec") else {}
            results.add(Measurement("typed-codec", CASE, name, rep, {"us/record": us}, notes))
