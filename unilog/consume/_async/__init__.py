"""The asyncio source of the consumers: edit these, then run ``python tools/faces.py`` to regenerate ``_sync/``."""
