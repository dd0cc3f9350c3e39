"""The asyncio source of the methods both faces of the Redis adapter have: edit these, then run
``python tools/faces.py`` to regenerate ``_sync/`` (see :mod:`unilog.engine`)."""
