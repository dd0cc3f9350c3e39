"""The threaded face of the producers' staging, generated from ``_async/`` by ``tools/faces.py``: do not edit."""
