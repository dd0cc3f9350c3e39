"""The producing side: staging a record in the caller's transaction (:func:`unilog.emit`, :func:`unilog.emit_async`,
:class:`unilog.Producer`). It imports nothing of the streaming or consuming sides (an import contract)."""
