"""The asyncio source of the producers' staging: edit it, then run ``python tools/faces.py`` (regenerates
``_sync/``)."""
