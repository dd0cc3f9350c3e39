"""Backfills: one cursor row per backfill (`unilog backfill`)

Revision ID: unilog_0008
Revises: unilog_0007
Create Date: 2026-11-26
"""

from alembic import op

revision = "unilog_0008"
down_revision = "unilog_0007"
branch_labels = None
depends_on = None

# A backfill stages one record per row of a table, page by page in key order. Each page's transaction stages its
# records and advances this row (last_key, rows_done) together, so a killed backfill resumes after its last committed
# page: no row missing, none staged twice (unilog/produce/backfill.py).
BACKFILLS = """
CREATE TABLE IF NOT EXISTS unilog_backfills (
    name          TEXT PRIMARY KEY,
    table_name    TEXT NOT NULL,
    key_column    TEXT NOT NULL,
    where_sql     TEXT,
    stream        TEXT NOT NULL DEFAULT '',
    object        TEXT NOT NULL,
    action        TEXT NOT NULL,
    batch_size    INTEGER NOT NULL,
    rate          DOUBLE PRECISION,
    last_key      TEXT,
    rows_done     BIGINT NOT NULL DEFAULT 0,
    rows_estimate BIGINT,
    status        TEXT NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done', 'cancelled')),
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ
)
"""


def upgrade() -> None:
    op.execute(BACKFILLS)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS unilog_backfills")
