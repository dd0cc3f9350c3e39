"""Record contracts: a staged record's type (``name@version``), carried to the stream entry's ``type`` field; the
schema registry (``unilog_schemas``, ``unilog_schema_modes``); ``unilog_emit`` takes a type name and version

Revision ID: unilog_0013
Revises: unilog_0012
Create Date: 2026-11-27
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "unilog_0013"
down_revision = "unilog_0012"
branch_labels = None
depends_on = None

# NULL for an untyped record; a typed one's "<name>@<version>" (unilog.contracts). A nullable column without a
# default is a catalog change only: no rewrite of a backlog.
COLUMN = "ALTER TABLE staged_log_records ADD COLUMN IF NOT EXISTS record_type TEXT"

# A backfill that stages typed records names its type's class (``module:Class``), imported by whoever runs a page.
BACKFILL = "ALTER TABLE unilog_backfills ADD COLUMN IF NOT EXISTS record_type TEXT"

# The registry: each record type's JSON Schema per version, written by `unilog schema register` or a migration,
# never by a producer at run time (producers check their records against their own classes). A stream's
# compatibility mode (Confluent's names, lower case) lives beside it; a stream without a row is "backward".
REGISTRY = """
CREATE TABLE IF NOT EXISTS unilog_schemas (
    name          TEXT        NOT NULL,
    version       INTEGER     NOT NULL CHECK (version >= 1),
    stream        TEXT        NOT NULL,
    object        TEXT        NOT NULL,
    action        TEXT        NOT NULL,
    schema        JSONB       NOT NULL,
    fingerprint   TEXT        NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    retired_at    TIMESTAMPTZ,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS unilog_schema_modes (
    stream TEXT PRIMARY KEY,
    mode   TEXT NOT NULL CHECK (mode IN ('none', 'backward', 'backward_transitive', 'forward', 'forward_transitive',
                                         'full', 'full_transitive'))
);
"""

# unilog_0010's function (read its comments: no query of its own on the message path) with the record's type as an
# eighth argument, defaulted so a caller of the seven (a producer not yet upgraded, mid-deploy) still resolves to it.
# A message's tail after its five publish arguments is empty, or the trace context's two bulk strings, or, for a
# typed record, three: traceparent, tracestate (maybe empty) and the type. The streamer pads shorter tails in a batch
# that has longer ones (unilog.routing), so every record of a batch has the same number of arguments. A typed
# record's tail length is written ``t<n>``: a streamer from before this migration cannot read that header and stops
# (DecodeError) instead of publishing three tail arguments where it expects two, which would shift every argument
# after them.
STAGE = r"""
DROP FUNCTION IF EXISTS unilog_stage(text, text, text, text, text, text, text);
CREATE OR REPLACE FUNCTION unilog_stage(
    p_action text, p_object text, p_data text, p_stream text, p_key text, p_traceparent text, p_tracestate text,
    p_type text DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    staged bigint;
    created text;
    tail text;
    messages boolean;
BEGIN
    IF coalesce(pg_sequence_last_value('unilog_emit_mode'::regclass), 0) = 1 THEN
        messages := CASE WHEN pg_advisory_xact_lock_shared(hashtextextended('unilog.emit_mode', 0))::text IS NULL
            THEN false ELSE coalesce(pg_sequence_last_value('unilog_emit_mode'::regclass), 0) = 1 END;
        IF messages THEN
            created := floor(date_part('epoch', now()) * 1000)::bigint::text;
            tail := CASE WHEN p_traceparent IS NOT NULL OR p_type IS NOT NULL THEN concat(
                '$', coalesce(octet_length(p_traceparent), 0), E'\r\n', p_traceparent, E'\r\n',
                '$', coalesce(octet_length(p_tracestate), 0), E'\r\n', p_tracestate, E'\r\n',
                CASE WHEN p_type IS NOT NULL THEN concat('$', octet_length(p_type), E'\r\n', p_type, E'\r\n') END)
                ELSE '' END;
            messages := pg_logical_emit_message(true, 'unilog', concat(
                p_stream, E'\n', CASE WHEN p_type IS NOT NULL THEN 't' END, octet_length(tail), E'\n',
                '$', octet_length(p_data), E'\r\n', p_data, E'\r\n',
                '$', octet_length(p_action), E'\r\n', p_action, E'\r\n',
                '$', octet_length(p_object), E'\r\n', p_object, E'\r\n',
                '$', octet_length(created), E'\r\n', created, E'\r\n',
                '$', coalesce(octet_length(p_key), 0), E'\r\n', p_key, E'\r\n',
                tail)) IS NULL;
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO staged_log_records (action, object, data, stream, key, traceparent, tracestate, record_type)
    VALUES (p_action, p_object, p_data::jsonb, p_stream, p_key, p_traceparent, p_tracestate, p_type)
    RETURNING id INTO staged;
    RETURN staged;
END $$
"""

# unilog_0009's public face with a type: record_type and record_version together, or neither. A registered type is
# checked here as far as SQL can practically check it: it is registered and not retired, its stream, object and
# action match, and data is a JSON object holding every property the schema requires. Property types, formats and
# nested objects are not checked in SQL (no JSON Schema validator ships with Postgres): a consumer reading the record
# typed refuses it as a poison record (docs/guides/record-contracts.md, "Producers in other languages").
EMIT = """
DROP FUNCTION IF EXISTS unilog_emit(text, text, text, text, jsonb, text, text, integer);
CREATE OR REPLACE FUNCTION unilog_emit(
    stream text, key text, action text, object text, data jsonb,
    traceparent text DEFAULT NULL, tracestate text DEFAULT NULL, max_payload_bytes integer DEFAULT 1048576,
    record_type text DEFAULT NULL, record_version integer DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    text_data text := data::text;
    tag text;
    reg record;
    missing text[];
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
    IF (record_type IS NULL) <> (record_version IS NULL) THEN
        RAISE EXCEPTION 'unilog_emit: give record_type and record_version together, or neither'
            USING ERRCODE = '22023';
    END IF;
    IF record_type IS NOT NULL THEN
        IF record_type !~ '^[A-Za-z][A-Za-z0-9_.-]{0,99}$' OR record_version < 1 THEN
            RAISE EXCEPTION 'unilog_emit: invalid record type %@%: a name of [A-Za-z0-9_.-] starting with a letter '
                'and a version from 1', quote_literal(record_type), record_version USING ERRCODE = '22023';
        END IF;
        SELECT s.stream, s.object, s.action, s.schema, s.retired_at INTO reg FROM unilog_schemas s
        WHERE s.name = record_type AND s.version = record_version;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'unilog_emit: record type %@% is not registered (unilog schema register)',
                record_type, record_version USING ERRCODE = '22023';
        END IF;
        IF reg.retired_at IS NOT NULL THEN
            RAISE EXCEPTION 'unilog_emit: record type %@% is retired', record_type, record_version
                USING ERRCODE = '22023';
        END IF;
        IF reg.stream <> coalesce(stream, '') OR reg.object <> object OR reg.action <> action THEN
            RAISE EXCEPTION 'unilog_emit: record type %@% is registered for stream %, object %, action %',
                record_type, record_version, quote_literal(reg.stream), quote_literal(reg.object),
                quote_literal(reg.action) USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(data) <> 'object' THEN
            RAISE EXCEPTION 'unilog_emit: record type %@% needs a JSON object as data, got %', record_type,
                record_version, jsonb_typeof(data) USING ERRCODE = '22023';
        END IF;
        missing := ARRAY(SELECT r FROM jsonb_array_elements_text(coalesce(reg.schema -> 'required', '[]')) r
                         WHERE NOT data ? r);
        IF cardinality(missing) > 0 THEN
            RAISE EXCEPTION 'unilog_emit: record type %@% requires %, missing from data', record_type,
                record_version, array_to_string(missing, ', ') USING ERRCODE = '22023';
        END IF;
        tag := record_type || '@' || record_version;
    END IF;
    RETURN unilog_stage(action, object, text_data, coalesce(stream, ''), key, traceparent, tracestate, tag);
END $$
"""


def upgrade() -> None:
    op.execute(COLUMN)
    op.execute(BACKFILL)
    op.execute(REGISTRY)
    op.execute(STAGE)
    op.execute(EMIT)


def _previous(name: str, file: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the earlier migration's definition, not a copy of it
    return module


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS unilog_emit(text, text, text, text, jsonb, text, text, integer, text, integer)")
    op.execute("DROP FUNCTION IF EXISTS unilog_stage(text, text, text, text, text, text, text, text)")
    op.execute(_previous("unilog_0010", "0010_cheaper_stage.py").STAGE)
    op.execute(_previous("unilog_0009", "0009_messages.py").EMIT)
    op.execute("DROP TABLE IF EXISTS unilog_schema_modes, unilog_schemas")
    op.execute("ALTER TABLE staged_log_records DROP COLUMN IF EXISTS record_type")
    op.execute("ALTER TABLE unilog_backfills DROP COLUMN IF EXISTS record_type")
