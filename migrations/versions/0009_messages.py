"""Records as logical messages in WAL capture mode; ``unilog_emit`` for producers in any language

Revision ID: unilog_0009
Revises: unilog_0008
Create Date: 2026-11-26
"""

from alembic import op

revision = "unilog_0009"
down_revision = "unilog_0008"
branch_labels = None
depends_on = None

# How producers stage a record: 0 a row of staged_log_records, 1 a transactional logical message (WAL capture mode).
# A sequence, not a table: a sequence's value is read as it is now, whatever the reader's snapshot, so a producer in
# a REPEATABLE READ transaction that began before a switch still sees it (a table row would show the old mode).
MODE = "CREATE SEQUENCE IF NOT EXISTS unilog_emit_mode MINVALUE 0 MAXVALUE 1 START 0 NO CYCLE"

# Where the WAL pass stands among record messages: the (commit LSN, ordinal) of the last one published, saved in the
# transaction that saves the positions, so messages the slot sends again after a crash are skipped (a row is
# recognised by being gone; a message leaves nothing behind to look at).
MARK = """
ALTER TABLE unilog_capture
    ADD COLUMN IF NOT EXISTS message_lsn     PG_LSN  NOT NULL DEFAULT '0/0',
    ADD COLUMN IF NOT EXISTS message_ordinal INTEGER NOT NULL DEFAULT -1
"""

# A switch never holds producers up: no producer waits for a lock a switch takes. In message mode a producer takes a
# shared advisory lock (held to its transaction's end) and reads the mode again under it; a switch to table mode sets
# the mode, then waits (polling pg_locks, queueing for nothing) for the transactions holding that lock to end, then
# commits a marker message. A producer that took the lock before the switch looked is waited for; one that took it
# after reads the new mode and writes a row. So every record message is committed before the marker, none after it,
# and the slot can be drained through the marker and dropped without losing one (unilog.store.set_emit_messages).
# The record message's content: its target stream, a line feed, the byte length of its trace part, a line feed, then
# the record's arguments to the publish script already encoded as RESP bulk strings (data, action, object, created
# ms, key or ''; then traceparent and tracestate when it has them), as table mode's packed fetch encodes them: the
# streamer concatenates messages into a batch without touching a record in Python. ``created`` is now(), the
# transaction's start, as staged_log_records.created_at. The lengths are octet_length() of server-encoding text, so
# producers write messages only in a UTF8 database (unilog capture wal keeps rows otherwise).
STAGE = """
CREATE OR REPLACE FUNCTION unilog_stage(
    p_action text, p_object text, p_data text, p_stream text, p_key text, p_traceparent text, p_tracestate text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    staged bigint;
    created text;
    k text;
    body text;
    trace text := '';
BEGIN
    IF (SELECT last_value FROM unilog_emit_mode) = 1 THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('unilog.emit_mode', 0));
        IF (SELECT last_value FROM unilog_emit_mode) = 1 THEN
            created := ((extract(epoch FROM now()) * 1000)::bigint)::text;
            k := coalesce(p_key, '');
            body := '$' || octet_length(p_data) || E'\\r\\n' || p_data || E'\\r\\n$' || octet_length(p_action)
                || E'\\r\\n' || p_action || E'\\r\\n$' || octet_length(p_object) || E'\\r\\n' || p_object
                || E'\\r\\n$' || octet_length(created) || E'\\r\\n' || created || E'\\r\\n$'
                || octet_length(k) || E'\\r\\n' || k || E'\\r\\n';
            IF p_traceparent IS NOT NULL THEN
                trace := '$' || octet_length(p_traceparent) || E'\\r\\n' || p_traceparent || E'\\r\\n$'
                    || octet_length(coalesce(p_tracestate, '')) || E'\\r\\n' || coalesce(p_tracestate, '')
                    || E'\\r\\n';
            END IF;
            PERFORM pg_logical_emit_message(true, 'unilog',
                p_stream || E'\\n' || octet_length(trace) || E'\\n' || body || trace);
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO staged_log_records (action, object, data, stream, key, traceparent, tracestate)
    VALUES (p_action, p_object, p_data::jsonb, p_stream, p_key, p_traceparent, p_tracestate)
    RETURNING id INTO staged;
    RETURN staged;
END $$
"""

# The public face, for SQL, triggers and producers in other languages: the checks emit() makes, then unilog_stage.
EMIT = """
CREATE OR REPLACE FUNCTION unilog_emit(
    stream text, key text, action text, object text, data jsonb,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL, max_payload_bytes integer DEFAULT 1048576
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    text_data text := data::text;
BEGIN
    IF action IS NULL OR btrim(action) = '' OR object IS NULL OR btrim(object) = '' THEN
        RAISE EXCEPTION 'unilog_emit: action and object must be non-empty text' USING ERRCODE = '22023';
    END IF;
    IF key IS NOT NULL AND btrim(key) = '' THEN
        RAISE EXCEPTION 'unilog_emit: key must be NULL or non-empty text' USING ERRCODE = '22023';
    END IF;
    IF coalesce(stream, '') <> '' AND stream !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$' THEN
        RAISE EXCEPTION 'unilog_emit: invalid stream name %: use 1-200 characters from [A-Za-z0-9_.:-], starting '
            'with a letter or digit', quote_literal(stream) USING ERRCODE = '22023';
    END IF;
    IF data IS NULL THEN
        RAISE EXCEPTION 'unilog_emit: data must not be NULL (use ''null''::jsonb for a JSON null)'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(text_data) > max_payload_bytes THEN
        RAISE EXCEPTION 'unilog_emit: data is % bytes as JSON, over the limit of % bytes',
            octet_length(text_data), max_payload_bytes USING ERRCODE = '54000';
    END IF;
    RETURN unilog_stage(action, object, text_data, coalesce(stream, ''), key, traceparent, tracestate);
END $$
"""


def upgrade() -> None:
    op.execute(MODE)
    op.execute(MARK)
    op.execute(STAGE)
    op.execute(EMIT)
    # A database already in WAL capture mode switches its producers to messages with `unilog capture wal` (run it
    # again): a migration does not flip it, so rows keep flowing as before until an operator chooses.


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS unilog_emit(text, text, text, text, jsonb, text, text, integer)")
    op.execute("DROP FUNCTION IF EXISTS unilog_stage(text, text, text, text, text, text, text)")
    op.execute("ALTER TABLE unilog_capture DROP COLUMN IF EXISTS message_lsn, DROP COLUMN IF EXISTS message_ordinal")
    op.execute("DROP SEQUENCE IF EXISTS unilog_emit_mode")
