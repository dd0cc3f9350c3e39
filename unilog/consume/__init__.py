"""The consuming side: checkpoint consumers, group workers and what they share.

Each worker's exactly-once sequence is written once, as asyncio code under ``_async/``; the threaded face under
``_sync/`` is generated from it by ``tools/faces.py`` (unasync's token renaming: ``async``/``await`` dropped,
``AsyncConsumer`` -> ``Consumer``, the store's and the Redis adapter's asyncio modules -> their sync ones), so the
two faces cannot drift; ``tests/test_faces.py`` fails when a generated file is stale. The public names stay where
users import them: :class:`unilog.Consumer`, :class:`unilog.AsyncConsumer`, ``unilog.consume.consumer``.
"""
