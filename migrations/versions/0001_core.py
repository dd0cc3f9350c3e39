"""unilog core: staged_log_records, producer identity, stream positions, consumer checkpoints

Revision ID: unilog_0001
Revises:
Create Date: 2026-11-21
"""

from alembic import op

revision = "unilog_0001"
down_revision = None
branch_labels = ("unilog",)
depends_on = None


def upgrade() -> None:
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
    op.execute("CREATE INDEX staged_log_records_stream_xid_id ON staged_log_records (stream, xid, id)")
    # Wake the streamer at commit: NOTIFY is transactional, delivered only if the producer's transaction commits.
    # A statement-level trigger covers emit() and raw INSERTs alike; identical notifications in one transaction
    # are folded into one by Postgres.
    op.execute(
        """
        CREATE FUNCTION unilog_notify_staged() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('unilog_staged', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER staged_log_records_notify AFTER INSERT ON staged_log_records
        FOR EACH STATEMENT EXECUTE FUNCTION unilog_notify_staged()
        """
    )
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
