"""The threaded face of the Redis adapter's shared methods, generated from ``_async/`` by ``tools/faces.py``: do not
edit."""
