"""The stream engine adapter: every Redis command unilog sends lives here.

The client is configured deliberately: redis-py's default retries a command that timed out, and a retried ``XADD``
whose first attempt did reach Redis appends the entry twice. unilog turns those retries off and retries whole
batches itself, where the outcome is known and deduplicated by position.

One module per concern, each a class over the client: :mod:`~unilog.engine.publish` (the idempotent publish script,
high-water marks), :mod:`~unilog.engine.read` (reads, ranges, waiting, a stream's ends),
:mod:`~unilog.engine.groups` (consumer groups), :mod:`~unilog.engine.retention` (registrations, trimming),
:mod:`~unilog.engine.letters` (dead letters), :mod:`~unilog.engine.partitions` (partition counts, heartbeats) and
:mod:`~unilog.engine.layout` (the key layout's move); :class:`RedisStreams` is all of them. Each method declares the
commands it issues (:mod:`~unilog.engine.commands`), which is where the ACL of each kind of process comes from
(:mod:`unilog.ops.acl`).

Two faces, one source: the methods the asyncio consumers need too (reads after a checkpoint, registration, dead
letters, group work, the client and ``explained`` of :class:`~unilog.engine._sync.base.Adapter`, connecting, a key's
node's connection) are written once,
as asyncio code under ``_async/`` (:class:`~unilog.engine.aio.AsyncRedisStreams` is them), and their threaded face
under ``_sync/`` is generated from it by ``tools/faces.py`` (on the syntax tree: ``await`` dropped, ``AsyncReadingCore``
-> ``ReadingCore``, ``aclose`` -> ``close``), declarations included; each concern class above adds the methods only
the threaded face has. ``tests/test_faces.py`` fails when a generated file is stale.
"""

from __future__ import annotations

from ..config import hidden

# redis-py 8 imports OpenTelemetry's metrics SDK when it is installed (redis.observability.providers), only to name
# a type in annotations: about 0.13 s of CPU of every process start (issue 45). Hidden, it changes nothing: redis-py's
# observability imports what it uses when an application turns it on.
with hidden("opentelemetry.sdk"):
    import redis

from ..wire import (  # noqa: F401 - the adapter's names, used as engine.X across the library
    Packed,
    PublishRow,
    _b,
    _pack,
    attempts_key,
    dlq_key,
    first_created_ms,
    hwm_key,
    id_tuple,
    letter_fields,
    meta_key,
    pack_rows,
    parse_autoclaim,
    registry_key,
    to_str,
    workers_key,
)
from ._sync.base import Adapter  # noqa: F401 - the adapter's names, used as engine.X across the library
from ._sync.server import ping  # noqa: F401 - the adapter's names, used as engine.X across the library
from .base import Entry, Fields  # noqa: F401 - the adapter's names, used as engine.X across the library
from .bulk import ids_many, no_gc, raw_pages  # noqa: F401 - the adapter's names, used as engine.X across the library
from .connection import connect  # noqa: F401 - every Redis client the library opens
from .groups import Groups
from .layout import Layout
from .letters import Letters
from .partitions import Partitions
from .publish import PUBLISH_LUA, MemoryUse, PartlyRefused, Publishing, PublishResult  # noqa: F401 - adapter's
from .read import PAGE, Reading, StreamInfo  # noqa: F401 - the adapter's names
from .refusals import (  # noqa: F401 - classifying refusals
    FATAL,
    batch_refusal,
    fatal,
    hint,
    no_permission,
    out_of_memory,
    read_only,
    refusal,
    type_checked,
)
from .retention import Retention
from .survey import RangeCount, StreamSurvey, Survey  # noqa: F401 - the adapter's names

# What a failure of Redis itself raises (other modules name it here instead of importing redis-py)
RedisError = redis.RedisError


class RedisStreams(Publishing, Letters, Survey, Reading, Groups, Retention, Partitions, Layout):
    """Publishing to and reading from Redis Streams: every concern of the adapter over one client."""
