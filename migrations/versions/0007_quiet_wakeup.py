"""The commit wake-up notifies only while a streamer sleeps

Revision ID: unilog_0007
Revises: unilog_0006
Create Date: 2026-11-25
"""

from alembic import op

revision = "unilog_0007"
down_revision = "unilog_0006"
branch_labels = None
depends_on = None

# NOTIFY takes a cluster-wide lock from a transaction's commit until its commit record is flushed, so producers that
# all notify commit one at a time (emit fell to 0.6x of a plain second INSERT at 8 clients). Now a streamer about
# to sleep on LISTEN holds the advisory lock 'unilog.wakeup' exclusively, and the trigger notifies only when it
# cannot take that lock shared. While no streamer sleeps, the shared lock it takes instead marks its transaction as
# one that staged and has not ended: a streamer can fall asleep (take the lock) only once every such transaction
# ended, so it never sleeps through a commit it has not seen (unilog.waiting.CommitListener).
QUIET = """
CREATE OR REPLACE FUNCTION unilog_notify_staged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('unilog.wakeup', 0)) THEN
        PERFORM pg_notify('unilog_staged', '');
    END IF;
    RETURN NULL;
END $$
"""

ALWAYS = """
CREATE OR REPLACE FUNCTION unilog_notify_staged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('unilog_staged', '');
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute(QUIET)


def downgrade() -> None:
    op.execute(ALWAYS)
