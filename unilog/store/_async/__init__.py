"""The asyncio source of the statements both faces of the store run (opening a session and the schema check, the
consumers' checkpoints, groups' processed identities, partition locks): edit these, then run
``python tools/faces.py`` to regenerate ``_sync/`` (see :mod:`unilog.store`)."""
