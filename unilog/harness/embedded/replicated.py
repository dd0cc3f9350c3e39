"""A throw-away Postgres primary with one streaming standby, for failover tests: kill the primary, promote the
standby, rewind the old primary and let it follow the new one, or switch the roles over cleanly.

Both nodes run with the same settings (so the roles can swap); what depends on the role is set where it belongs:
a standby's ``primary_conninfo``, ``primary_slot_name`` (and, Postgres 17+, ``sync_replication_slots``) in its
``unilog.conf`` (written on each start) with ``standby.signal``; a primary's ``synchronous_standby_names`` and
(17+) ``synchronized_standby_slots`` with ``ALTER SYSTEM`` and a reload, so that they follow a promotion without a
restart, as Patroni does. Each node streams through a physical replication slot its primary keeps for it
(:meth:`ReplicatedPostgres.slot_for`).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog

from .binaries import PostgresBinaries, find_postgres
from .postgres import EmbeddedPostgres
from .process import EmbeddedServerError, _new_temp_dir, _wait_until

log = structlog.get_logger(__name__)

STREAMING_TIMEOUT = 30.0
NODE_NAMES = ("a", "b")
# Postgres 17 added failover slots: logical slots synchronized to the standby (``sync_replication_slots``)
FAILOVER_SLOTS_MAJOR = 17
# The standby-only settings: a promoted node drops them, a node that rejoins as standby gets them again
_STANDBY_KEYS = ("primary_conninfo", "primary_slot_name", "sync_replication_slots")


def replication_settings() -> dict[str, str]:
    """The settings both nodes run with, whatever their role."""
    return {
        "wal_level": "logical",
        "hot_standby": "on",
        "hot_standby_feedback": "on",  # keeps the primary from removing rows (and catalog rows) a standby needs
        "max_wal_senders": "10",
        "max_replication_slots": "10",
        # pg_rewind: hint-bit changes must be WAL-logged and full pages written after each checkpoint
        # (EmbeddedPostgres turns full_page_writes off when fsync is off)
        "wal_log_hints": "on",
        "full_page_writes": "on",
        # the standby reports its positions each second (default 10 s): slot sync and catch-up waits see them sooner
        "wal_receiver_status_interval": "1s",
    }


class ReplicatedPostgres:
    """A primary and one streaming standby (physical replication slot), for failover tests.

    :attr:`primary` is the node that is primary now and :attr:`standby` the one following it (None after
    :meth:`failover` until :meth:`rejoin`); :attr:`nodes` keeps the fixed order (node A, node B) that :attr:`url`
    lists. With ``synchronous=True`` the primary waits for the standby's flush on each commit
    (``synchronous_standby_names`` naming the standby) while a standby is attached, so a failover loses no committed
    transaction. ``settings`` are added to both nodes' (see :func:`replication_settings`). ``basebackup_r``: the
    standby is made the usual way, ``pg_basebackup -R``, whose ``primary_conninfo`` without ``dbname`` (in
    ``postgresql.auto.conf``, which wins) keeps slot synchronisation from running although it is configured.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        binaries: PostgresBinaries | None = None,
        synchronous: bool = True,
        settings: Mapping[str, str] | None = None,
        basebackup_r: bool = False,
    ) -> None:
        self.binaries = binaries or find_postgres()
        self.synchronous = synchronous
        self.basebackup_r = basebackup_r
        self._owns_base_dir = base_dir is None
        self.base_dir = _new_temp_dir("unilog-pgha-") if base_dir is None else Path(base_dir).absolute()
        node_settings = replication_settings() | dict(settings or {})
        self.nodes: tuple[EmbeddedPostgres, EmbeddedPostgres] = tuple(  # type: ignore[assignment]
            EmbeddedPostgres(self.base_dir / name, binaries=self.binaries, settings=node_settings)
            for name in NODE_NAMES
        )
        self.primary: EmbeddedPostgres = self.nodes[0]
        self.standby: EmbeddedPostgres | None = self.nodes[1]
        self._started = False

    @property
    def failover_slots(self) -> bool:
        """Whether these binaries synchronize failover-enabled logical slots to the standby (Postgres 17+)."""
        return self.binaries.major >= FAILOVER_SLOTS_MAJOR

    @property
    def down(self) -> EmbeddedPostgres | None:
        """The node that is neither primary nor standby now (the old primary after :meth:`failover`), or None."""
        return None if self.standby is not None else self._other(self.primary)

    def slot_for(self, node: EmbeddedPostgres) -> str:
        """Name of the physical replication slot a primary keeps for ``node`` (``unilog_node_a``/``_b``)."""
        return f"unilog_node_{NODE_NAMES[self.nodes.index(node)]}"

    @property
    def url(self) -> str:
        """Multi-host libpq URL of the ``postgres`` database over both nodes in fixed order; libpq connects to
        whichever accepts writes (``target_session_attrs=read-write``), so it follows a failover."""
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        """:attr:`url` for database ``dbname`` (which must already exist)."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    # -- life cycle --------------------------------------------------------- #

    def start(self) -> Self:
        """initdb and start node A as primary, copy it with ``pg_basebackup`` to node B, start B as its standby,
        and return once B streams (synchronously with ``synchronous=True``). Only a fresh pair can be started;
        on failure whatever was started is stopped again."""
        if self._started:
            raise EmbeddedServerError("a ReplicatedPostgres starts once (its nodes keep running until stop())")
        self._started = True
        atexit.register(self._atexit_stop)
        primary, standby = self.nodes
        try:
            primary.start()
            self._create_physical_slot(primary, self.slot_for(standby))
            standby.clone_from(primary, slot=self.slot_for(standby), write_recovery_conf=self.basebackup_r)
            self._follow(standby, primary)
            standby.start()
            self._attach(primary, standby)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *, cleanup: bool = False) -> None:
        """Stop both nodes (fast; the standby first, so it does not chase a primary going away). ``cleanup=True``
        then deletes their files, and the base directory if this instance created it."""
        for node in (self.standby, self.primary, self.down):
            if node is not None:
                node.stop("fast", cleanup=cleanup)
        atexit.unregister(self._atexit_stop)
        if cleanup and self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            for node in self.nodes:
                node.stop("immediate", cleanup=True)
            if self._owns_base_dir:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(cleanup=True)

    # -- role changes -------------------------------------------------------- #

    def failover(self) -> float:
        """Kill the primary (SIGKILL, :meth:`EmbeddedPostgres.kill`; a no-op if it is down already), promote the
        standby and return the seconds until it committed a write through :attr:`url`. Afterwards :attr:`primary`
        is the old standby, with no synchronous standby required, and :attr:`standby` is None until
        :meth:`rejoin`."""
        began = time.monotonic()
        self._require_standby()
        self.primary.kill()
        self._promote_standby()
        return time.monotonic() - began

    def rejoin(self) -> None:
        """Bring the node that is down back as the standby of the current primary: ``pg_rewind`` it onto the
        primary's timeline (recovering a killed node first), drop the slots it kept (stale now), start it
        following the primary through its physical slot, and return once it streams; the primary then requires
        it again (``synchronous_standby_names``, Postgres 17+ ``synchronized_standby_slots``)."""
        node, primary = self.down, self.primary
        if node is None:
            raise EmbeddedServerError("no node is down: rejoin() follows failover()")
        node.rewind_from(primary)
        # like a fresh pg_basebackup, the standby starts without slots: its physical slot for the other node and
        # its logical slots are stale, and a local logical slot named like a failover slot would stop slot sync
        for slot_dir in (node.data_dir / "pg_replslot").iterdir():
            shutil.rmtree(slot_dir)
        self._create_physical_slot(primary, self.slot_for(node))
        self._follow(node, primary)
        node.start()
        self.standby = node
        self._attach(primary, node)

    def switchover(self) -> None:
        """Swap the roles cleanly: wait until the standby replayed all of the primary's WAL, stop the primary
        (fast: its walsender ships the shutdown checkpoint first), promote the standby, rejoin the old primary."""
        self.wait_caught_up()
        self.primary.stop("fast")
        self._promote_standby()
        self.rejoin()

    def wait_streaming(self, timeout: float = STREAMING_TIMEOUT) -> None:
        """Wait until ``pg_stat_replication`` on the primary shows the standby streaming (and, with
        ``synchronous=True``, as the synchronous standby: ``sync_state = 'sync'``)."""
        self._wait_replication(("sync" if self.synchronous else "async",), timeout)

    def _wait_replication(self, sync_states: tuple[str, ...], timeout: float = STREAMING_TIMEOUT) -> None:
        standby = self._require_standby()
        query = "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s"
        last: list[Any] = []

        def streaming() -> bool:
            nonlocal last
            last = _rows(self.primary.url, query, (self.slot_for(standby),))
            return any(state == "streaming" and sync in sync_states for state, sync in last)

        if not _wait_until(streaming, timeout):
            wanted = f"streaming with sync_state in {sync_states}"
            raise EmbeddedServerError(f"standby on port {standby.port} not {wanted} after {timeout}s: {last}")

    def wait_caught_up(self, timeout: float = STREAMING_TIMEOUT) -> None:
        """Wait until the standby has replayed the primary's WAL up to its current insert position."""
        standby = self._require_standby()
        target = _rows(self.primary.url, "SELECT pg_current_wal_insert_lsn()::text")[0][0]
        query = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
        if not _wait_until(lambda: bool(_rows(standby.url, query, (target,))[0][0]), timeout):
            raise EmbeddedServerError(f"standby on port {standby.port} did not replay up to {target} in {timeout}s")

    def wait_slot_synced(self, name: str, *, advance: bool = False, timeout: float = 60.0) -> None:
        """Wait until the standby holds a copy of the primary's failover-enabled logical slot ``name`` that
        survives a promotion: ``synced AND NOT temporary AND invalidation_reason IS NULL`` in its
        ``pg_replication_slots`` (Postgres 17+; see the docs' "failover_ready" query).

        The standby's slot sync worker keeps a new copy temporary (dropped on promotion) until the primary's slot
        has moved past what the standby reserved for it (restart_lsn, catalog_xmin), which only decoding and
        confirming changes after the copy was made does. So each poll logs a running-transactions record on the
        primary (``pg_log_standby_snapshot()``, which decoding needs to move catalog_xmin), and with
        ``advance=True`` also advances the slot to the current WAL position, standing in for a consumer
        (it consumes whatever the slot had not confirmed). The worker naps up to 30 s between rounds when idle."""
        if not self.failover_slots:
            raise EmbeddedServerError(f"Postgres {self.binaries.version} has no slot sync (17+)")
        standby = self._require_standby()

        def synced() -> bool:
            _rows(self.primary.url, "SELECT pg_log_standby_snapshot()")
            if advance:
                _rows(self.primary.url, "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (name,))
            if self.copy_ready(name):
                return True
            time.sleep(0.2)  # each round writes WAL: a round per sync-worker nap (200 ms at its briskest) will do
            return False

        if not _wait_until(synced, timeout):
            state = _rows(standby.url, "SELECT * FROM pg_replication_slots WHERE slot_name = %s", (name,))
            raise EmbeddedServerError(f"slot {name!r} not synced to the standby in {timeout}s: {state}")

    def copy_ready(self, name: str) -> bool:
        """Whether the standby (False without one) holds a copy of logical slot ``name`` that survives a promotion:
        ``synced AND NOT temporary AND invalidation_reason IS NULL`` (see :meth:`wait_slot_synced`)."""
        if self.standby is None or not self.failover_slots:
            return False
        ready = (
            "SELECT synced AND NOT temporary AND invalidation_reason IS NULL "
            "FROM pg_replication_slots WHERE slot_name = %s"
        )
        return any(row[0] for row in _rows(self.standby.url, ready, (name,)))

    # -- internals ----------------------------------------------------------- #

    def _other(self, node: EmbeddedPostgres) -> EmbeddedPostgres:
        return self.nodes[1 - self.nodes.index(node)]

    def _require_standby(self) -> EmbeddedPostgres:
        if self.standby is None:
            raise EmbeddedServerError("no standby attached (after failover(), rejoin() attaches the old primary)")
        return self.standby

    def _follow(self, node: EmbeddedPostgres, primary: EmbeddedPostgres) -> None:
        """Configure ``node`` (stopped) to start as a standby of ``primary``, through its physical slot."""
        name = self.slot_for(node)
        # dbname: slot sync connects to a database; application_name: how pg_stat_replication names the standby
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres application_name={name}"
        node.settings |= {"primary_conninfo": conninfo, "primary_slot_name": name}
        if self.basebackup_r:  # its primary_conninfo names no application: the walreceiver goes by cluster_name
            node.settings["cluster_name"] = name
        if self.failover_slots:
            node.settings["sync_replication_slots"] = "on"
        node.standby = True

    def _attach(self, primary: EmbeddedPostgres, standby: EmbeddedPostgres) -> None:
        """Once ``standby`` streams, make ``primary`` wait for it (commits, and logical walsenders on 17+)."""
        self._wait_replication(("async", "sync"))
        self._set_primary_role(primary, standby)
        self.wait_streaming()  # again: sync_state turns 'sync' once the reload took effect

    def _promote_standby(self) -> None:
        """Promote the standby: it requires no standby first (so its first commits cannot block), keeps a
        physical slot for the old primary to rejoin through, and has committed a write through :attr:`url`."""
        new, old = self._require_standby(), self.primary
        self._set_primary_role(new, None)  # ALTER SYSTEM works on a standby: nothing to wait for once promoted
        new.promote()
        for key in _STANDBY_KEYS:
            new.settings.pop(key, None)
        self.primary, self.standby = new, None
        self._create_physical_slot(new, self.slot_for(old))
        _rows(self.url, "SELECT pg_current_xact_id()")  # assigns an xid: its commit writes (and flushes) WAL
        log.debug("postgres promoted", port=new.port)

    def _set_primary_role(self, node: EmbeddedPostgres, standby: EmbeddedPostgres | None) -> None:
        """What a primary waits for: its standby's flush on commit (``synchronous=True``), and, Postgres 17+,
        the standby's slot before logical walsenders send changes (so a failover slot never runs ahead of it)."""
        from psycopg import sql

        # the standby by name, never '*': '*' also matches a logical walsender (unilog's WAL streamer), which Postgres
        # may then pick as the synchronous standby, so that every commit waits for the streamer
        named = f'"{self.slot_for(standby)}"' if standby is not None and self.synchronous else ""
        values = {"synchronous_standby_names": named}
        if self.failover_slots:
            values["synchronized_standby_slots"] = self.slot_for(standby) if standby is not None else ""
        with _connect(node.url) as conn:
            for name, value in values.items():
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            conn.execute("SELECT pg_reload_conf()")

    @staticmethod
    def _create_physical_slot(node: EmbeddedPostgres, name: str) -> None:
        """Create physical slot ``name`` on ``node`` unless it exists, reserving WAL from now on."""
        query = (
            "SELECT pg_create_physical_replication_slot(%(name)s, true) WHERE NOT EXISTS "
            "(SELECT 1 FROM pg_replication_slots WHERE slot_name = %(name)s)"
        )
        _rows(node.url, query, {"name": name})


def _rows(url: str, query: str, params: Any = None) -> list[Any]:
    """Run one statement in autocommit mode; its rows, if it returns any."""
    with _connect(url) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _connect(url: str) -> Any:
    import psycopg  # deferred, as in postgres.py: Redis-only users need not pay for it

    return psycopg.connect(url, connect_timeout=5, autocommit=True)
