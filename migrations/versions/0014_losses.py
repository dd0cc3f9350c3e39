"""WAL capture's recovery of a lost slot: where the slot last needed the WAL from, and the record of each loss

Revision ID: unilog_0014
Revises: unilog_0013
Create Date: 2026-11-28
"""

from alembic import op

revision = "unilog_0014"
down_revision = "unilog_0013"
branch_labels = None
depends_on = None

# restart_lsn: the capture slot's restart_lsn as the guard last saw it (and at the slot's creation). It replicates
# with the table, so a promoted standby knows where a slot it has no copy of needed the WAL from: a recovery reads the
# record messages the slot had not delivered from there (unilog/store/recovery.py).
RESTART = "ALTER TABLE unilog_capture ADD COLUMN IF NOT EXISTS restart_lsn PG_LSN"

# One row per lost capture slot: the WAL range read, the record messages recovered from it and those that could not
# be (NULL: how many is unknown), why, and the operator's acknowledgement. A loss with nothing lost is acknowledged
# when it is recorded; one with records lost stays unacknowledged (status, metrics, the alert) until an operator
# acknowledges it (`unilog capture losses --ack ID`).
LOSSES = """
CREATE TABLE IF NOT EXISTS unilog_capture_losses (
    id              BIGSERIAL PRIMARY KEY,
    detected_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    slot            TEXT        NOT NULL,
    from_lsn        PG_LSN      NOT NULL,
    to_lsn          PG_LSN      NOT NULL,
    recovered       INTEGER     NOT NULL DEFAULT 0,
    lost            INTEGER,
    detail          TEXT        NOT NULL,
    acknowledged_at TIMESTAMPTZ,
    acknowledged_by TEXT
)
"""


def upgrade() -> None:
    op.execute(RESTART)
    op.execute(LOSSES)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS unilog_capture_losses")
    op.execute("ALTER TABLE unilog_capture DROP COLUMN IF EXISTS restart_lsn")
