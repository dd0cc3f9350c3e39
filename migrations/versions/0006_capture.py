"""WAL capture: the database's replication slot and publication, when it is in WAL capture mode

Revision ID: unilog_0006
Revises: unilog_0005
Create Date: 2026-11-25
"""

from alembic import op

revision = "unilog_0006"
down_revision = "unilog_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One row at most: a database is in WAL capture mode (``unilog capture wal``) or, with no row, in table mode.
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS unilog_capture (
            singleton   BOOLEAN     PRIMARY KEY DEFAULT TRUE CHECK (singleton),
            slot_name   TEXT        NOT NULL,
            publication TEXT        NOT NULL,
            from_xid    XID8        NOT NULL,
            enabled_at  TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS unilog_capture")
