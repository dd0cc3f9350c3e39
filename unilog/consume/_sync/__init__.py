"""The threaded face of the consumers, generated from ``_async/`` by ``tools/faces.py``: do not edit."""
