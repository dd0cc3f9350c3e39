"""The producing side: staging a record in the caller's transaction (:func:`unilog.emit`, :func:`unilog.emit_async`,
:class:`unilog.Producer`), and backfills, a record per existing row of a table (:mod:`unilog.produce.backfill`). It
imports nothing of the streaming or consuming sides (an import contract)."""
