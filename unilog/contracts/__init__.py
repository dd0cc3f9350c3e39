"""Record contracts: typed records, declared once and checked on both sides of the log.

A record type is a pydantic v2 ``BaseModel`` or a dataclass declared with :func:`record_type`, bound to its stream,
object and action, with a version. Emitting an instance validates and encodes it (:meth:`Contract.encode`); a
consumer gets instances back (:meth:`Contract.decode`), older versions brought up to date by :func:`upcaster`
functions. :mod:`unilog.contracts.compat` tells whether a new version can be read where an older one is, the way
Confluent's schema registry defines it.

``import unilog`` does not import pydantic; this package does (``pip install 'unilog-outbox[contracts]'``).
"""

from __future__ import annotations

try:
    import pydantic  # noqa: F401  (here, so that a missing extra is one line naming it)
except ImportError as exc:  # pragma: no cover - the dev environment has pydantic
    from ..errors import MissingExtra

    raise MissingExtra("record contracts need pydantic: pip install 'unilog-outbox[contracts]'") from exc

from .declare import Contract, all_contracts, contract_of, contracts_in, record_type, upcaster

__all__ = ["Contract", "all_contracts", "contract_of", "contracts_in", "record_type", "upcaster"]
