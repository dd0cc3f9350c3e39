"""Trace context: the W3C traceparent and tracestate of the transaction that staged each record

Revision ID: unilog_0005
Revises: unilog_0004
Create Date: 2026-11-24
"""

from alembic import op

revision = "unilog_0005"
down_revision = "unilog_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: adding them rewrites nothing, and a producer without OpenTelemetry leaves them NULL.
    op.execute("ALTER TABLE staged_log_records ADD COLUMN IF NOT EXISTS traceparent TEXT")
    op.execute("ALTER TABLE staged_log_records ADD COLUMN IF NOT EXISTS tracestate TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE staged_log_records DROP COLUMN IF EXISTS tracestate")
    op.execute("ALTER TABLE staged_log_records DROP COLUMN IF EXISTS traceparent")
