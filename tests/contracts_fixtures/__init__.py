"""Record type modules for tests/test_schema_registry.py: each declares one version of ``RideCreated`` (stream
``rides``), so ``unilog schema check|register`` is run on one module per process (a process knows one class per
name and version)."""
