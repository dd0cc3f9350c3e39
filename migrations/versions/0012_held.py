"""WAL capture's hold: why producers stage rows although the database is in WAL mode, and since when

Revision ID: unilog_0012
Revises: unilog_0011
Create Date: 2026-11-27
"""

from alembic import op

revision = "unilog_0012"
down_revision = "unilog_0011"
branch_labels = None
depends_on = None

# A slot that a failover or max_slot_wal_keep_size can take away holds producers to rows before it goes (the hold,
# unilog/stream/guard.py): held_reason says why (NULL: not held), held_lsn where the WAL stood when producers were
# switched, held_saved whether every record message written before then was delivered or turned into a row, so a
# slot lost later cost nothing. A hold is released, producers back to messages, when the risk has passed.
HELD = """
ALTER TABLE unilog_capture
    ADD COLUMN IF NOT EXISTS held_reason TEXT,
    ADD COLUMN IF NOT EXISTS held_lsn    PG_LSN,
    ADD COLUMN IF NOT EXISTS held_saved  BOOLEAN NOT NULL DEFAULT FALSE
"""


def upgrade() -> None:
    op.execute(HELD)


def downgrade() -> None:
    op.execute(
        "ALTER TABLE unilog_capture DROP COLUMN IF EXISTS held_reason, DROP COLUMN IF EXISTS held_lsn, "
        "DROP COLUMN IF EXISTS held_saved"
    )
