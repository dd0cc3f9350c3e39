"""unilog core: staged_log_records, producer identity, stream positions, consumer checkpoints

Revision ID: unilog_0001
Revises:
Create Date: 2026-11-21
"""

from alembic import op

from unilog.errors import IncompatibleTable

revision = "unilog_0001"
down_revision = None
branch_labels = ("unilog",)
depends_on = None


# unilog's columns beyond the reference design's (id, action, object, data), with the defaults that keep a
# reference-style `INSERT INTO staged_log_records (action, object, data)` working.
UNILOG_COLUMNS = {
    "stream": ("text", "TEXT NOT NULL DEFAULT ''"),
    "key": ("text", "TEXT"),
    "xid": ("xid8", "XID8 NOT NULL DEFAULT pg_current_xact_id()"),
    "created_at": ("timestamp with time zone", "TIMESTAMPTZ NOT NULL DEFAULT now()"),
}
REFERENCE_COLUMNS = {
    "id": ("bigint", "integer"),
    "action": ("text", "character varying"),
    "object": ("text", "character varying"),
    "data": ("jsonb",),
}


def upgrade() -> None:
    if op.get_bind().exec_driver_sql("SELECT to_regclass('staged_log_records')").scalar() is None:
        _create_staging()
    else:
        _adopt_staging()
    _index_and_trigger()
    _unilog_tables()


def _create_staging() -> None:
    # A superset of the reference design's table: every extra column has a default, so a reference-style
    # `INSERT INTO staged_log_records(action, object, data)` keeps working and lands on the default stream ('').
    # xid is the inserting transaction's id: the streamer only reads rows below the visibility horizon and
    # publishes them in (xid, id) order, so a transaction that commits late is never skipped.
    op.execute(
        """
        CREATE TABLE staged_log_records (
            id         BIGSERIAL PRIMARY KEY,
            action     TEXT        NOT NULL,
            object     TEXT        NOT NULL,
            data       JSONB       NOT NULL,
            stream     TEXT        NOT NULL DEFAULT '',
            key        TEXT,
            xid        XID8        NOT NULL DEFAULT pg_current_xact_id(),
            created_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )


def _columns() -> dict[str, tuple[str, bool, bool]]:
    """The staging table's columns: name -> (type, nullable, has a default)."""
    rows = op.get_bind().exec_driver_sql(
        "SELECT column_name, data_type, is_nullable = 'YES', column_default IS NOT NULL OR is_identity = 'YES' "
        "FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'staged_log_records'"
    )
    return {name: (kind, nullable, default) for name, kind, nullable, default in rows}


def _refuse(column: str, problem: str, fix: str) -> None:
    raise IncompatibleTable(
        f"cannot adopt the existing staged_log_records: column {column} {problem}; {fix}, then run `unilog migrate` "
        "again"
    )


def _check_adoptable(columns: dict[str, tuple[str, bool, bool]]) -> None:
    """Refuse a table unilog cannot publish from, naming the column and the fix."""
    for name, kinds in REFERENCE_COLUMNS.items():
        if name not in columns:
            _refuse(name, "is missing", f"add it ({kinds[0]} NOT NULL)")
        kind, nullable, _default = columns[name]
        if kind not in kinds:
            _refuse(name, f"is {kind}", f"ALTER TABLE staged_log_records ALTER COLUMN {name} TYPE {kinds[0]}")
        if nullable:
            _refuse(name, "allows NULL", f"ALTER TABLE staged_log_records ALTER COLUMN {name} SET NOT NULL")
    if not columns["id"][2]:
        _refuse("id", "has no default", "make it a bigserial or an identity column")
    unique = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = i.indkey[0] WHERE i.indrelid = 'staged_log_records'::regclass AND i.indisunique "
            "AND i.indnkeyatts = 1 AND a.attname = 'id')"
        )
        .scalar()
    )
    if not unique:
        _refuse("id", "is not unique", "make it the primary key (ALTER TABLE staged_log_records ADD PRIMARY KEY (id))")
    for name, (kind, _ddl) in UNILOG_COLUMNS.items():
        if name in columns and columns[name][0] != kind:
            _refuse(name, f"is {columns[name][0]}, unilog's is {kind}", "rename or drop that column")


def _adopt_staging() -> None:
    """Adopt a reference-style table in place, keeping every pending row.

    The added columns take their defaults without rewriting the table. Rows already there get transaction id 1,
    below every horizon, so the streamer publishes them first and in ``id`` order; new rows get their own
    transaction's id from then on. The table is locked for the rest of this transaction: producers that insert
    meanwhile wait for it to commit, and nothing they write is missed.
    """
    columns = _columns()
    _check_adoptable(columns)
    op.execute("LOCK TABLE staged_log_records IN ACCESS EXCLUSIVE MODE")
    for name, (_kind, ddl) in UNILOG_COLUMNS.items():
        if name in columns:
            continue
        if name == "xid":
            op.execute("ALTER TABLE staged_log_records ADD COLUMN xid XID8 NOT NULL DEFAULT '1'::xid8")
            op.execute("ALTER TABLE staged_log_records ALTER COLUMN xid SET DEFAULT pg_current_xact_id()")
        else:
            op.execute(f"ALTER TABLE staged_log_records ADD COLUMN {name} {ddl}")


def _index_and_trigger() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS staged_log_records_stream_xid_id ON staged_log_records (stream, xid, id)")
    # Wake the streamer at commit: NOTIFY is transactional, delivered only if the producer's transaction commits.
    # A statement-level trigger covers emit() and raw INSERTs alike; identical notifications in one transaction
    # are folded into one by Postgres.
    op.execute(
        """
        CREATE OR REPLACE FUNCTION unilog_notify_staged() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('unilog_staged', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute("DROP TRIGGER IF EXISTS staged_log_records_notify ON staged_log_records")
    op.execute(
        """
        CREATE TRIGGER staged_log_records_notify AFTER INSERT ON staged_log_records
        FOR EACH STATEMENT EXECUTE FUNCTION unilog_notify_staged()
        """
    )


def _unilog_tables() -> None:
    # This database's identity as a producer: positions are per (producer, stream), so several producer databases
    # can publish into one stream without shadowing each other. The epoch changes when the database is restored
    # into another cluster, where transaction ids restart lower.
    op.execute(
        """
        CREATE TABLE unilog_producer (
            singleton         BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
            producer_id       TEXT    NOT NULL,
            epoch             INTEGER NOT NULL DEFAULT 1,
            system_identifier BIGINT
        )
        """
    )
    op.execute(
        """
        INSERT INTO unilog_producer (producer_id, system_identifier)
        SELECT 'p' || substr(md5(random()::text || clock_timestamp()::text), 1, 12),
               (SELECT system_identifier FROM pg_control_system())
        """
    )
    # The last position published per stream: the streamer assigns dense, gap-free sequence numbers in
    # (xid, id) order and advances this row in the same transaction that deletes the published records.
    op.execute(
        """
        CREATE TABLE unilog_stream_positions (
            stream     TEXT        PRIMARY KEY,
            epoch      INTEGER     NOT NULL,
            last_seq   BIGINT      NOT NULL DEFAULT 0,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    # A consumer's checkpoint: the last stream entry id it consumed and, per producer, the last (epoch, seq)
    # it applied. It is updated in the same transaction as the consumer's own state.
    op.execute(
        """
        CREATE TABLE unilog_checkpoints (
            name       TEXT        PRIMARY KEY,
            stream     TEXT        NOT NULL,
            last_id    TEXT        NOT NULL DEFAULT '0-0',
            positions  JSONB       NOT NULL DEFAULT '{}'::jsonb,
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS unilog_checkpoints")
    op.execute("DROP TABLE IF EXISTS unilog_stream_positions")
    op.execute("DROP TABLE IF EXISTS unilog_producer")
    op.execute("DROP TABLE IF EXISTS staged_log_records")
    op.execute("DROP FUNCTION IF EXISTS unilog_notify_staged()")
