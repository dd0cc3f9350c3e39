"""Dead letters of checkpoint consumers: the records each one moved aside, so a replay is applied once

Revision ID: unilog_0004
Revises: unilog_0003
Create Date: 2026-11-24
"""

from alembic import op

revision = "unilog_0004"
down_revision = "unilog_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A checkpoint consumer that dead-letters a record inserts its origin here, in the transaction that moves its
    # checkpoint past it. Its checkpoint alone would skip the replayed copy as already applied; this row says "not
    # applied: apply a replay once", and is deleted in the transaction that applies the replay.
    op.execute(
        """
        CREATE TABLE unilog_held_letters (
            consumer   TEXT        NOT NULL,
            origin_id  TEXT        NOT NULL,
            stream     TEXT        NOT NULL,
            held_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (consumer, origin_id)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS unilog_held_letters")
