"""The Postgres adapter: every SQL statement the library runs lives in this package.

Workers, the CLI and the pipeline call these functions; they never build SQL themselves (``tests/architecture.py``
checks it). Functions take an open psycopg connection and never commit unless their docstring says so: transaction
boundaries belong to the caller, because the guarantees (state and checkpoint in one transaction, delete only after
Redis confirmed) are decided there. Modules by concern: ``connection`` (opening connections, deadlines, the schema
check), ``staging`` (the staging table), ``positions`` (producer identity and published positions),
``checkpoints``, ``groups`` (consumer groups' processed identities), ``locks`` (advisory locks) and ``snapshots``
(consistent parallel reads for reconciliation).
"""

from __future__ import annotations

from . import roles
from .checkpoints import (
    Checkpoint,
    checkpoint_stream,
    ensure_checkpoint,
    hold_letter,
    list_checkpoints,
    lock_checkpoint,
    lock_consumer,
    read_checkpoint,
    release_held,
    save_checkpoint,
    take_held,
)
from .connection import (
    FATAL,
    SCHEMA_HEAD,
    VERSION_TABLE,
    check_schema,
    connect,
    deadline,
    fatal,
    take_migration_lock,
)
from .groups import (
    Identity,
    advance_watermarks,
    claim_identities,
    group_watermarks,
    mark_dropped,
    try_prune_lock,
)
from .locks import (
    release_partition_lock,
    stream_lock_holders,
    try_partition_lock,
    try_stream_lock,
)
from .positions import (
    ProducerIdentity,
    adopt_identity,
    last_published_seq,
    producer_identity,
    resolve_identity,
    set_producer_id,
)
from .snapshots import (
    export_snapshot,
    id_bounds,
    import_snapshot,
    rows_between,
    staged_records,
)
from .staging import (
    FETCH_BATCH,
    FETCH_PACKED,
    INSERT_STAGED,
    NOTIFY_CHANNEL,
    START,
    VISIBLE_BATCH,
    StagedRow,
    delete_published,
    describe_holder,
    fetch_packed,
    fetch_visible,
    has_staged,
    held_back,
    horizon_holder,
    listen,
    packed_fetch_supported,
    staged_backlog,
    staged_by_stream,
    staged_sources,
)

__all__ = [
    "FATAL",
    "FETCH_BATCH",
    "FETCH_PACKED",
    "INSERT_STAGED",
    "NOTIFY_CHANNEL",
    "SCHEMA_HEAD",
    "START",
    "VERSION_TABLE",
    "VISIBLE_BATCH",
    "Checkpoint",
    "Identity",
    "ProducerIdentity",
    "StagedRow",
    "adopt_identity",
    "advance_watermarks",
    "check_schema",
    "checkpoint_stream",
    "claim_identities",
    "connect",
    "deadline",
    "delete_published",
    "describe_holder",
    "ensure_checkpoint",
    "export_snapshot",
    "fatal",
    "fetch_packed",
    "fetch_visible",
    "group_watermarks",
    "has_staged",
    "held_back",
    "hold_letter",
    "horizon_holder",
    "id_bounds",
    "import_snapshot",
    "last_published_seq",
    "list_checkpoints",
    "listen",
    "lock_checkpoint",
    "lock_consumer",
    "mark_dropped",
    "packed_fetch_supported",
    "producer_identity",
    "read_checkpoint",
    "release_held",
    "release_partition_lock",
    "resolve_identity",
    "roles",
    "rows_between",
    "save_checkpoint",
    "set_producer_id",
    "staged_backlog",
    "staged_by_stream",
    "staged_records",
    "staged_sources",
    "stream_lock_holders",
    "take_held",
    "take_migration_lock",
    "try_partition_lock",
    "try_prune_lock",
    "try_stream_lock",
]
