"""The threaded face of the store's shared statements, generated from ``_async/`` by ``tools/faces.py``: do not
edit."""
