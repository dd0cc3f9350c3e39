"""Consumer groups: records applied per group, and the watermark below which they are all applied

Revision ID: unilog_0003
Revises: unilog_0002
Create Date: 2026-11-21
"""

from alembic import op

revision = "unilog_0003"
down_revision = "unilog_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A group worker inserts the identity of every record it applies here, in the transaction of the effect; a
    # redelivered record finds its row and is skipped. Rows at or below the group's watermark are pruned.
    op.execute(
        """
        CREATE TABLE unilog_processed (
            group_name TEXT    NOT NULL,
            stream     TEXT    NOT NULL,
            producer   TEXT    NOT NULL,
            epoch      BIGINT  NOT NULL,
            seq        BIGINT  NOT NULL,
            PRIMARY KEY (group_name, stream, producer, epoch, seq)
        )
        """
    )
    # Per (group, stream, producer, epoch): every seq <= this one has been applied (or dropped from the dead letters).
    op.execute(
        """
        CREATE TABLE unilog_group_watermarks (
            group_name TEXT    NOT NULL,
            stream     TEXT    NOT NULL,
            producer   TEXT    NOT NULL,
            epoch      BIGINT  NOT NULL,
            seq        BIGINT  NOT NULL,
            PRIMARY KEY (group_name, stream, producer, epoch)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS unilog_group_watermarks")
    op.execute("DROP TABLE IF EXISTS unilog_processed")
