"""The consuming side: checkpoint consumers, group workers, partition workers and what they share.

Each worker's exactly-once sequence is written once, as asyncio code under ``_async/``; the threaded face under
``_sync/`` is generated from it by ``tools/faces.py`` (on the syntax tree: ``async``/``await`` dropped,
``AsyncConsumer`` -> ``Consumer``, the store's and the Redis adapter's asyncio modules -> the threaded ones), so the
two faces cannot drift; ``tests/test_faces.py`` fails when a generated file is stale. The public names stay where
users import them: :class:`unilog.Consumer`, :class:`unilog.AsyncConsumer`, ``unilog.consume.consumer``,
``unilog.consume.group``, ``unilog.consume.partitions``.
"""
