"""The threaded face of the worker loop, generated from ``_async/`` by ``tools/faces.py``: do not edit."""
