"""The asyncio source of the worker loop: edit it, then run ``python tools/faces.py`` to regenerate ``_sync/``."""
