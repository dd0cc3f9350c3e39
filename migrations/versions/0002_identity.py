"""Producer identity: remember which database and cluster the producer id belongs to

Revision ID: unilog_0002
Revises: unilog_0001
Create Date: 2026-11-21
"""

from alembic import op

revision = "unilog_0002"
down_revision = "unilog_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # When the database is restored into another cluster (transaction ids restart lower there) or copied into a new
    # database, the stored identity no longer matches and the streamer starts a new epoch
    # (unilog.store.resolve_identity).
    op.execute("ALTER TABLE unilog_producer ADD COLUMN database_oid OID")
    op.execute(
        "UPDATE unilog_producer SET database_oid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE unilog_producer DROP COLUMN database_oid")
