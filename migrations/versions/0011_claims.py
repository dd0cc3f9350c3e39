"""Table mode without the visibility horizon: claims (batch manifests) and the (stream, id) read index

Revision ID: unilog_0011
Revises: unilog_0010
Create Date: 2026-11-27
"""

from alembic import op

revision = "unilog_0011"
down_revision = "unilog_0010"
branch_labels = None
depends_on = None

# Table mode used to read only rows below the cluster's visibility horizon, in (xid, id) order: any open transaction
# that held an xid, in any database, held every record back, and xid order is not commit order (an xid is taken at a
# transaction's first write). Now a streamer claims the committed rows it has not published yet, in id order (ids are
# taken at emit, after the rows the producer locked), and saves the claim before it sends: a claim is the batch's
# ids as runs of consecutive ids (lo[i]..hi[i]), so a re-send after a crash sends the same records, in the same
# order, under the same positions (unilog/stream/capture_table.py says why that order is commit order per row).
# The (stream, id) index is the claim's read path; (stream, xid, id) finds the rows of transactions that were still
# open at the last claim. Ids must be handed out in time order, so the id sequence's per-session cache is set to 1
# (sessions connected before it keep the values they cached: reconnect producers after upgrading an adopted table
# whose sequence had a cache). The index is built in the migration's transaction, which holds producers' inserts
# for the build: on a large backlog, drain it first.
CLAIMS = """
CREATE TABLE IF NOT EXISTS unilog_claims (
    claim   bigserial PRIMARY KEY,
    source  text      NOT NULL,
    lo      bigint[]  NOT NULL,
    hi      bigint[]  NOT NULL,
    records integer   NOT NULL
)
"""

SEQUENCE = "SELECT pg_get_serial_sequence('staged_log_records', 'id')"


def upgrade() -> None:
    op.execute(CLAIMS)
    op.execute("CREATE INDEX IF NOT EXISTS staged_log_records_stream_id ON staged_log_records (stream, id)")
    bind = op.get_bind()
    sequence = bind.exec_driver_sql(SEQUENCE).scalar()
    if sequence is not None:
        cache = bind.exec_driver_sql(f"SELECT seqcache FROM pg_sequence WHERE seqrelid = '{sequence}'::regclass")
        cache = cache.scalar()
        if cache is not None and cache > 1:  # an adopted table's sequence: ids must follow emit order across sessions
            op.execute(f"ALTER SEQUENCE {sequence} CACHE 1")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS staged_log_records_stream_id")
    op.execute("DROP TABLE IF EXISTS unilog_claims")
