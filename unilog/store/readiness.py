"""Failover readiness: whether every standby that could be promoted holds a copy of the WAL capture slot that
survives the promotion, verified on the standbys themselves rather than trusted from the slot's ``failover`` flag.

A failover slot (Postgres 17+) is copied only by a standby that runs ``sync_replication_slots`` with
``hot_standby_feedback``, a ``primary_slot_name`` and a ``primary_conninfo`` naming a database; a new copy stays
*temporary* (dropped by a promotion) until the primary's slot has moved past what the standby reserved for it. The
primary cannot see any of that, so the copies are read on the standbys: the hosts of ``DATABASE_URL`` (a multi-host
URL names them) and any further URLs given (``UNILOG_STANDBY_URLS``, for a URL that is a virtual IP). The standbys
that could be promoted are the primary's: every physical walsender and every physical slot. A standby counts as
ready only when it is reached and holds a copy that is ``synced AND NOT temporary`` and not invalidated; everything
else (unreachable, not named, no copy, a copy not yet synchronised, a setting missing) is a reason, in one line, and
the guard holds producers to rows while there is one.

The same read says when ``synchronized_standby_slots`` names a physical slot that is missing or inactive: Postgres
then holds logical decoding back (the streamer receives nothing) until the slot exists and catches up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import UnilogError
from .connection import connect

PROBE_TIMEOUT = 2.0  # seconds to reach a standby (libpq's minimum connect_timeout)


@dataclass(frozen=True)
class StandbyCopy:
    """One standby of the primary and its copy of the capture slot. ``standby``: how the primary names it (its
    physical slot, else its application name); ``host``: where its copy was read (None: not reached or not
    named); ``ready``: the copy survives a promotion; ``why``: what is missing, when not ready; ``lag_bytes``: how
    far the copy's confirmed position is behind the primary's slot."""

    standby: str
    host: str | None
    ready: bool
    why: str | None = None
    lag_bytes: int | None = None


@dataclass(frozen=True)
class Readiness:
    """Whether a failover now keeps the capture slot: ``ready`` when every standby holds a ready copy (true with no
    standby); ``reason``: one line saying which standby is not and why; ``held_back``: one line when
    ``synchronized_standby_slots`` names a physical slot that is missing or inactive (logical decoding waits)."""

    ready: bool
    reason: str | None
    copies: tuple[StandbyCopy, ...]
    held_back: str | None = None


# The primary's standbys: each physical walsender (with its slot, if it streams through one, and whether a slot
# synchronisation worker from the same address is connected: what a standby that copies slots has), then each
# physical slot no one streams from (a standby that is away keeps its slot and may still be promoted).
_ATTACHED = """
    SELECT coalesce(s.slot_name, nullif(r.application_name, ''), 'pid ' || r.pid), s.slot_name,
           EXISTS (SELECT 1 FROM pg_stat_activity a
                   WHERE a.datid IS NOT NULL AND a.backend_type = 'client backend'
                     AND a.client_addr IS NOT DISTINCT FROM r.client_addr
                     AND (a.application_name = r.application_name OR a.application_name LIKE '%%slotsync worker'))
    FROM pg_stat_replication r JOIN pg_stat_activity w ON w.pid = r.pid AND w.datid IS NULL
    LEFT JOIN pg_replication_slots s ON s.active_pid = r.pid AND s.slot_type = 'physical'
    UNION ALL
    SELECT slot_name, slot_name, NULL FROM pg_replication_slots WHERE slot_type = 'physical' AND NOT active
"""

# A standby's view of itself and of its copy of the slot.
_STANDBY_SIDE = """
    SELECT current_setting('primary_slot_name'), current_setting('sync_replication_slots'),
           current_setting('hot_standby_feedback'),
           (SELECT setting FROM pg_settings WHERE name = 'primary_conninfo'),
           EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'slotsync worker'),
           c.synced, c.temporary, c.invalidation_reason, (c.confirmed_flush_lsn - '0/0')::numeric
    FROM (SELECT 1) one
    LEFT JOIN pg_replication_slots c ON c.slot_name = %s
"""


def failover_readiness(
    conn: psycopg.Connection[Any], slot: str, conninfos: Sequence[str], timeout: float = PROBE_TIMEOUT
) -> Readiness:
    """The :class:`Readiness` of failover slot ``slot`` on the primary ``conn`` (Postgres 17+), reading the copies
    on the standbys among the hosts of ``conninfos``. Ends no transaction of ``conn``; each standby is read in a
    session of its own."""
    attached = [(str(r[0]), r[1], r[2]) for r in conn.execute(_ATTACHED).fetchall()]
    held_back = _held_back(conn)
    if not attached:
        return Readiness(True, None, (), held_back)
    row = conn.execute(
        "SELECT (confirmed_flush_lsn - '0/0')::numeric FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    primary_at = int(row[0]) if row and row[0] is not None else None
    seen = _standby_views(conninfos, slot, timeout)
    copies = tuple(
        _copy(name, physical, syncing, seen.get(physical or ""), slot, primary_at)
        for name, physical, syncing in attached
    )
    missing = [c for c in copies if not c.ready]
    if not missing:
        return Readiness(True, None, copies, held_back)
    reason = "failover not ready: " + "; ".join(f"standby {c.standby}: {c.why}" for c in missing)
    return Readiness(False, reason, copies, held_back)


def _copy(
    name: str,
    physical: str | None,
    syncing: bool | None,
    view: dict[str, Any] | None,
    slot: str,
    primary_at: int | None,
) -> StandbyCopy:
    """The verdict on one attached standby, from what the primary and (when reached) the standby itself say."""
    if physical is None:
        return StandbyCopy(name, None, False, "it streams without a physical slot (primary_slot_name), which slot "
                           "synchronisation needs")  # fmt: skip
    if view is None:
        why = _UNVERIFIED + (_NO_WORKER if syncing is False else "")
        return StandbyCopy(name, None, False, why)
    host = view["host"]
    lag = None if view["at"] is None or primary_at is None else max(0, primary_at - view["at"])
    if view["ready"]:
        return StandbyCopy(name, host, True, None, lag)
    return StandbyCopy(name, host, False, f"{_why_not(view, slot, syncing)} (read on {host})", lag)


_UNVERIFIED = (
    "its copy of the slot cannot be verified: it is not among the hosts of DATABASE_URL or UNILOG_STANDBY_URLS, or "
    "not reachable"
)
_NO_WORKER = (
    "; no slot synchronisation worker of it is connected to the primary (sync_replication_slots off, or a "
    "primary_conninfo without dbname, as pg_basebackup -R writes it)"
)


def _why_not(view: dict[str, Any], slot: str, syncing: bool | None) -> str:
    if view["sync"] != "on":
        return "sync_replication_slots is off, so it keeps no copy of the slot"
    if view["feedback"] != "on":
        return "hot_standby_feedback is off, which slot synchronisation requires"
    conninfo = view["conninfo"]
    # a running worker settles it (RDS names the database in a setting of its own, not in primary_conninfo)
    if not view["worker"] and conninfo and "*" not in conninfo and "dbname" not in conninfo_keys(conninfo):
        return ("its primary_conninfo has no dbname (pg_basebackup -R writes it so, in postgresql.auto.conf, which "
                "wins over postgresql.conf): slot synchronisation cannot run")  # fmt: skip
    if not view["worker"] or syncing is False:
        return "no slot synchronisation worker runs (its log says why: a primary_conninfo without dbname, usually)"
    if not view["exists"]:
        return f"it has no copy of slot {slot!r} yet"
    if view["invalidated"]:
        return f"its copy of slot {slot!r} is invalidated ({view['invalidated']})"
    return (f"its copy of slot {slot!r} is not synchronised yet (temporary until the primary's slot moves past what "
            "the standby reserved for it: traffic and a streamer confirming it do that)")  # fmt: skip


def conninfo_keys(conninfo: str) -> set[str]:
    """The keywords a conninfo string sets (empty if it cannot be parsed)."""
    try:
        return set(conninfo_to_dict(conninfo))
    except psycopg.ProgrammingError:
        return set()


def _standby_views(conninfos: Sequence[str], slot: str, timeout: float) -> dict[str, dict[str, Any]]:
    """What each standby among the hosts of ``conninfos`` says, by its ``primary_slot_name``; primaries, and hosts
    that cannot be reached, are left out."""
    views: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    for conninfo in conninfos:
        for host, single in hosts_of(conninfo):
            if host in done:
                continue
            done.add(host)
            view = _standby_view(host, single, slot, timeout)
            if view is not None and view["slot"]:
                views.setdefault(view["slot"], view)
    return views


def _standby_view(host: str, conninfo: str, slot: str, timeout: float) -> dict[str, Any] | None:
    try:
        conn = connect(conninfo, autocommit=True, application_name="unilog-readiness", timeout=timeout, standby=True)
    except UnilogError:
        return None
    try:
        with conn:
            if conn.info.parameter_status("in_hot_standby") != "on" or conn.info.server_version < 170000:
                return None
            r = conn.execute(_STANDBY_SIDE, (slot,)).fetchone()
    except psycopg.Error:
        return None
    assert r is not None
    ready = bool(r[5]) and not r[6] and r[7] is None
    return {
        "host": host, "slot": r[0], "sync": r[1], "feedback": r[2], "conninfo": r[3], "worker": bool(r[4]),
        "exists": r[5] is not None, "ready": ready, "invalidated": r[7], "at": None if r[8] is None else int(r[8]),
    }  # fmt: skip


def _held_back(conn: psycopg.Connection[Any]) -> str | None:
    """One line when ``synchronized_standby_slots`` names a physical slot that does not exist or is not active:
    Postgres then holds logical decoding back, so no streamer receives anything until it does."""
    row = conn.execute("SELECT current_setting('synchronized_standby_slots', true)").fetchone()
    names = [n.strip().strip('"') for n in str((row or [""])[0] or "").split(",") if n.strip()]
    if not names or names == ["*"]:
        return None
    found = dict(
        conn.execute(
            "SELECT slot_name, active FROM pg_replication_slots WHERE slot_type = 'physical' AND slot_name = ANY(%s)",
            (names,),
        ).fetchall()
    )
    for name in names:
        if name not in found:
            return (f"replication slot {name!r} named in synchronized_standby_slots does not exist: Postgres holds "
                    "logical decoding back, so nothing is streamed (create the slot, or remove it from the setting "
                    "and reload)")  # fmt: skip
        if not found[name]:
            return (f"replication slot {name!r} named in synchronized_standby_slots is not active (its standby is "
                    "away): Postgres holds logical decoding back once the slot falls behind (bring the standby "
                    "back, or remove it from the setting and reload)")  # fmt: skip
    return None


def hosts_of(conninfo: str) -> list[tuple[str, str]]:
    """(``host:port``, a conninfo for that host alone) for each host of ``conninfo``."""
    params = conninfo_to_dict(conninfo)
    hosts = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    key = "host" if params.get("host") else "hostaddr"
    return [
        (f"{h}:{p}", make_conninfo(conninfo, **{key: h}, port=p, target_session_attrs="any"))
        for h, p in zip(hosts, ports, strict=False)
    ]
