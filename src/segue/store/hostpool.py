"""The host pool in one SQLite file shared by every segue home on the machine,
or in a PostgreSQL store's database shared by every host of a cluster.

Where it lives (first that applies):

1. ``--pool PATH`` (the CLI exports it as ``$SEGUE_POOL``) or ``$SEGUE_POOL``
   (a path, or a ``postgresql://`` URL);
2. the home's PostgreSQL store, when it has one: one pool for every host that
   shares the store (:mod:`segue.store.postgres_hostpool`);
3. ``/var/lib/segue/pool.db`` when that directory exists and this user may
   write it (root creates it; an administrator shares it between users by
   making it group-writable), so every user of the machine shares one pool;
4. ``${XDG_STATE_HOME:-~/.local/state}/segue/pool.db``: shared by every home
   of this user.

Each method is one transaction (writes take ``BEGIN IMMEDIATE``), values are
bound parameters, and each thread of each process opens its own connection,
exactly like the metadata store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StoreError
from ..placement.policy import (
    Capacity,
    Need,
    gib,
    kind_matches,
    place,
    wait_reason,
)
from .base import Clock, now
from .hostpool_elastic import ElasticPoolMixin
from .hostpool_rows import (
    _LIVE,
    Db,
    _alloc,
    _free,
    _host,
    _pool_change,
    _preemption,
    _request,
    _requests,
    kinds,
)
from .pool import (
    Allocated,
    AllocationRecord,
    Denied,
    HostPool,
    HostPoolStore,
    PoolChange,
    PreemptionRequest,
    RequestRecord,
)
from .postgres import is_postgres_url
from .sqlite_rows import BUSY_TIMEOUT_S, PerThreadConnection, configure

T = TypeVar("T")


POOL_ENV = "SEGUE_POOL"
SHARED_DIR = Path("/var/lib/segue")

_SCHEMA = (
    """CREATE TABLE hosts (host TEXT PRIMARY KEY, cpus REAL NOT NULL, memory INTEGER NOT NULL,
       source TEXT NOT NULL, updated_at REAL NOT NULL)""",
    """CREATE TABLE devices (host TEXT NOT NULL REFERENCES hosts (host) ON DELETE CASCADE,
       device INTEGER NOT NULL, name TEXT NOT NULL, memory INTEGER NOT NULL,
       virtual INTEGER NOT NULL, PRIMARY KEY (host, device))""",
    # epoch is NULL between allocate and bind; the history of released rows is
    # kept so that tests can prove no device ever had two overlapping holders.
    """CREATE TABLE allocations (id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL,
       home TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL, epoch INTEGER,
       devices TEXT NOT NULL, cpus REAL NOT NULL, memory INTEGER NOT NULL,
       priority INTEGER NOT NULL, preemptible INTEGER NOT NULL, since REAL NOT NULL,
       lease_until REAL NOT NULL, released_at REAL, ckpt_at REAL,
       preemptions INTEGER NOT NULL DEFAULT 0, UNIQUE (home, run_id, step, epoch))""",
    "CREATE INDEX allocations_live ON allocations (host, released_at)",
    """CREATE TABLE requests (home TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL,
       host TEXT NOT NULL, priority INTEGER NOT NULL, gpus INTEGER NOT NULL, gpu_memory INTEGER,
       cpus REAL NOT NULL, memory INTEGER NOT NULL, submitted_at REAL NOT NULL,
       reason TEXT NOT NULL, lease_until REAL NOT NULL, PRIMARY KEY (home, run_id, step))""",
    """CREATE TABLE preemptions (id INTEGER PRIMARY KEY AUTOINCREMENT, home TEXT NOT NULL,
       run_id TEXT NOT NULL, by_home TEXT NOT NULL, by_run TEXT NOT NULL, reason TEXT NOT NULL,
       created_at REAL NOT NULL, lease_until REAL NOT NULL, outcome TEXT, handled_at REAL)""",
    "CREATE INDEX preemptions_open ON preemptions (home, run_id, outcome)",
    """CREATE TABLE parked (home TEXT NOT NULL, run_id TEXT NOT NULL, since REAL NOT NULL,
       PRIMARY KEY (home, run_id))""",
)
# Version 2: who changed a host's pool, and how (configure_host with an actor).
_SCHEMA_V2 = (
    """CREATE TABLE pool_changes (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
       host TEXT NOT NULL, actor TEXT NOT NULL, user TEXT NOT NULL, change TEXT NOT NULL)""",
    "CREATE INDEX pool_changes_by_host ON pool_changes (host, id)",
)
# Version 3: memory-aware sharing. An allocation records the bytes it uses on each
# of its devices (NULL: it holds them whole, as every allocation of versions 1 and 2
# did, so old rows keep their meaning); a request records its accelerator hint.
_SCHEMA_V3 = (
    "ALTER TABLE allocations ADD COLUMN gpu_memory INTEGER",
    "ALTER TABLE requests ADD COLUMN accelerator TEXT",
)
# Version 4: elastic map steps. An allocation may be resized (partial preemption,
# autoscaling): it records its sub-workers' device group size, the fewest devices it
# keeps, the devices promised to a preemptor and the row it resized; a preemption
# request may name devices (partial) instead of the whole run.
_SCHEMA_V4 = (
    "ALTER TABLE allocations ADD COLUMN per_worker INTEGER",
    "ALTER TABLE allocations ADD COLUMN min_gpus INTEGER",
    "ALTER TABLE allocations ADD COLUMN revoke TEXT",
    "ALTER TABLE allocations ADD COLUMN parent INTEGER",
    "ALTER TABLE allocations ADD COLUMN accelerator TEXT",
    "ALTER TABLE preemptions ADD COLUMN devices TEXT",
)
# (version a database has once applied, statements): schemas are frozen once shipped;
# a change is a new step, applied to older files when they are opened.
# Version 5: the tables a PostgreSQL store's database already has names for (its
# agents' hosts, its homes' requests) carry the pool's prefix, so that one SQL text
# serves the file and the cluster-wide pool in PostgreSQL.
_SCHEMA_V5 = (
    "ALTER TABLE hosts RENAME TO pool_hosts",
    "ALTER TABLE devices RENAME TO pool_devices",
    "ALTER TABLE requests RENAME TO pool_requests",
)
_STEPS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, _SCHEMA), (2, _SCHEMA_V2), (3, _SCHEMA_V3), (4, _SCHEMA_V4), (5, _SCHEMA_V5))
VERSION = _STEPS[-1][0]


def pool_path(home: Path | str | None = None, *, store: str | None = None) -> Path | str:
    """Where this process's host pool lives (see the module docstring): a file, or
    the PostgreSQL URL of a cluster-wide pool. ``store``: the home's store given
    explicitly (see segue.store.store_url)."""
    env = os.environ.get(POOL_ENV)
    if env:
        return env if is_postgres_url(env) else Path(env).expanduser().resolve()
    if home is not None:
        from . import store_url

        url = store_url(Path(home), store)
        if url is not None:
            return url  # the home's runs share their store's cluster-wide pool
    if os.geteuid() == 0 or (SHARED_DIR.is_dir() and os.access(SHARED_DIR, os.W_OK | os.X_OK)):
        return SHARED_DIR / "pool.db"
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state).expanduser() / "segue" / "pool.db"


def home_key(home: Path | str, store: Any) -> str:
    """How the pool names a home's runs: its path, or for a PostgreSQL store the
    cluster's id, the same on every host (a run's controller may move between hosts)."""
    key = getattr(store, "cluster_key", None)
    return key if isinstance(key, str) else str(home)


class SqlHostPool(ElasticPoolMixin, HostPoolStore):
    """The pool's logic in SQL that SQLite and PostgreSQL both speak (``?`` parameters).

    A backend supplies :meth:`_write` and :meth:`_read`: each runs ``body`` in one
    transaction with a :class:`Db` and returns its result. Writes are serialised
    (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: one advisory lock), so a read of the
    free capacity and the insert that follows it judge the same pool.
    """

    @abstractmethod
    def _write(self, body: Callable[[Db], T]) -> T: ...

    @abstractmethod
    def _read(self, body: Callable[[Db], T]) -> T: ...

    # -- hosts ---------------------------------------------------------------
    def configure_host(
        self, host: str, *, cpus: float, memory: int,
        devices: Sequence[tuple[str, int, bool]], source: str, actor: str | None = None,
        only_if_new: bool = False,
    ) -> HostPool:
        if cpus <= 0 or memory < 0:
            raise ValueError("a host needs cpus > 0 and memory >= 0")

        def body(db: Db) -> HostPool:
            t = db.now()
            before = _host(db, host)
            if only_if_new and before is not None:
                return before
            db.execute(
                "INSERT INTO pool_hosts (host, cpus, memory, source, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (host) DO UPDATE SET cpus = excluded.cpus, memory = excluded.memory,"
                " source = excluded.source, updated_at = excluded.updated_at",
                (host, float(cpus), int(memory), source, t),
            )
            db.execute("DELETE FROM pool_devices WHERE host = ?", (host,))
            db.executemany(
                "INSERT INTO pool_devices (host, device, name, memory, virtual) VALUES (?, ?, ?, ?, ?)",
                [(host, i, n, int(m), int(v)) for i, (n, m, v) in enumerate(devices)],
            )
            hp = _host(db, host)
            assert hp is not None  # just written
            if actor is not None:  # in the same transaction: no change goes unrecorded
                change = {"before": None if before is None else pool_summary(before),
                          "after": pool_summary(hp)}
                db.execute(
                    'INSERT INTO pool_changes (time, host, actor, "user", change) VALUES (?, ?, ?, ?, ?)',
                    (t, host, actor, _os_user(), json.dumps(change, sort_keys=True)))
            return hp

        return self._write(body)

    def pool_changes(self, host: str | None = None, *, limit: int = 100) -> list[PoolChange]:
        sql, args = "SELECT * FROM pool_changes", list[Any]()
        if host is not None:
            sql += " WHERE host = ?"
            args.append(host)
        args.append(max(0, int(limit)))
        return self._read(lambda db: [_pool_change(r) for r in
                                      db.execute(sql + " ORDER BY id DESC LIMIT ?", args)])

    def get_host(self, host: str) -> HostPool | None:
        return self._read(lambda db: _host(db, host))

    def list_hosts(self) -> list[HostPool]:
        """Every host configured in the pool, by name."""
        def body(db: Db) -> list[HostPool]:
            names = [r["host"] for r in db.execute("SELECT host FROM pool_hosts ORDER BY host")]
            return [hp for hp in (_host(db, n) for n in names) if hp is not None]

        return self._read(body)

    def free_capacity(self, host: str, home: str | None = None) -> Capacity:
        return self._read(lambda db: _free(db, host, db.now(), home))

    # -- allocations ---------------------------------------------------------
    def allocate(
        self, home: str, run_id: str, step: str, *, host: str, need: Need, priority: int,
        preemptible: bool, ttl_s: float,
    ) -> Allocated | Denied:
        def body(db: Db) -> Allocated | Denied:
            t = db.now()
            hp = _host(db, host)
            if hp is None:
                return Denied(f"host {host!r} is not in the pool; run `segue pool set` or "
                              "`segue pool detect`", never=True)
            never = never_fits(need, hp)
            if never is not None:
                return Denied(never, never=True)
            # Read and insert in this one serialised transaction: two placements
            # racing for the last free bytes of a device serialize here, so the sum of
            # a device's sharers never exceeds its memory.
            free = _free(db, host, t, home)
            devs = place(need, free)
            if devs is None:
                return Denied(wait_reason(need, free))
            mine = db.execute(
                "SELECT submitted_at FROM pool_requests WHERE home = ? AND run_id = ? AND step = ?"
                " AND lease_until > ?", (home, run_id, step, t)).fetchone()
            my_time = mine["submitted_at"] if mine else t
            for r in _requests(db, host, t):
                if (r.home, r.run_id, r.step) == (home, run_id, step) or never_fits(r.need, hp):
                    continue  # ourselves, or a request that can never run here
                if r.home != home and not (r.need.gpus and need.gpus):
                    continue  # homes compete for devices only
                # No backfilling past a higher class: it would take the capacity a
                # preemptor is freeing, and the urgent run would starve. Within a
                # class, FIFO with backfill for requests that fit anyway.
                if r.priority > priority or (
                    r.priority == priority and r.submitted_at < my_time
                    and place(shared_part(r.need, r.home != home), free) is not None
                ):
                    return Denied(f"waiting behind run {r.run_id!r} step {r.step!r}"
                                  f"{_where(r.home, home)} (priority {r.priority}, "
                                  f"waiting since {r.submitted_at:.3f})")
            row = db.execute(
                "INSERT INTO allocations (host, home, run_id, step, epoch, devices, cpus, memory,"
                " priority, preemptible, since, lease_until, gpu_memory, per_worker, min_gpus,"
                " accelerator) VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " RETURNING id",
                (host, home, run_id, step, json.dumps(devs), float(need.cpus), int(need.memory),
                 int(priority), int(preemptible), t, t + ttl_s,
                 need.gpu_memory if need.shares else None,
                 need.per_worker or None, need.gpus if need.per_worker else None,
                 need.accelerator),
            ).fetchone()
            db.execute("DELETE FROM pool_requests WHERE home = ? AND run_id = ? AND step = ?",
                       (home, run_id, step))
            return Allocated(int(row["id"]), tuple(devs))

        return self._write(body)

    def bind(self, alloc_id: int, epoch: int, ttl_s: float) -> bool:
        def body(db: Db) -> bool:
            t = db.now()
            # A home deleted and made again at the same path starts its epochs over:
            # its predecessor's dead rows (released, or lease lapsed) give up the key,
            # keeping their history under a negative epoch. A live holder keeps it, and
            # then this bind fails like any other lost race (the NOT EXISTS below: a
            # failed statement would abort a PostgreSQL transaction).
            db.execute(
                "UPDATE allocations SET epoch = -id WHERE id != ? AND epoch = ?"
                " AND (home, run_id, step) = (SELECT home, run_id, step FROM allocations"
                " WHERE id = ?) AND NOT (released_at IS NULL AND lease_until > ?)",
                (alloc_id, epoch, alloc_id, t))
            cur = db.execute(
                f"UPDATE allocations SET epoch = ?, lease_until = ? WHERE id = ?"
                f" AND epoch IS NULL AND {_LIVE} AND NOT EXISTS (SELECT 1 FROM allocations o"
                " WHERE o.epoch = ? AND (o.home, o.run_id, o.step) = (SELECT home, run_id, step"
                " FROM allocations WHERE id = ?))",
                (epoch, t + ttl_s, alloc_id, t, epoch, alloc_id))
            return cur.rowcount == 1

        return self._write(body)

    def renew(self, home: str, run_id: str, step: str, epoch: int, *, ttl_s: float,
              ckpt_at: float | None, preemptions: int) -> bool:
        def body(db: Db) -> bool:
            t = db.now()
            cur = db.execute(
                "UPDATE allocations SET lease_until = ?, ckpt_at = ?, preemptions = ?"
                f" WHERE home = ? AND run_id = ? AND step = ? AND epoch = ? AND {_LIVE}",
                (t + ttl_s, ckpt_at, preemptions, home, run_id, step, epoch, t))
            return cur.rowcount == 1

        return self._write(body)

    def release(self, home: str, run_id: str, step: str, epoch: int) -> AllocationRecord | None:
        key = (home, run_id, step, epoch)
        where = "home = ? AND run_id = ? AND step = ? AND epoch = ?"

        def body(db: Db) -> AllocationRecord | None:
            db.execute(f"UPDATE allocations SET released_at = ? WHERE {where}"
                       " AND released_at IS NULL", (db.now(), *key))
            row = db.execute(f"SELECT * FROM allocations WHERE {where}", key).fetchone()
            return None if row is None else _alloc(row)

        return self._write(body)

    def release_id(self, alloc_id: int) -> None:
        self._write(lambda db: db.execute(
            "UPDATE allocations SET released_at = ? WHERE id = ? AND released_at IS NULL",
            (db.now(), alloc_id)))

    def list_allocations(self, host: str | None = None, *, live_only: bool = True
                         ) -> list[AllocationRecord]:
        def body(db: Db) -> list[AllocationRecord]:
            sql, args = "SELECT * FROM allocations WHERE 1 = 1", list[Any]()
            if host is not None:
                sql += " AND host = ?"
                args.append(host)
            if live_only:
                sql += f" AND {_LIVE}"
                args.append(db.now())
            return [_alloc(r) for r in db.execute(sql + " ORDER BY id", args)]

        return self._read(body)

    # -- the queue -------------------------------------------------------------
    def upsert_request(
        self, home: str, run_id: str, step: str, *, host: str, need: Need, priority: int,
        reason: str, ttl_s: float,
    ) -> RequestRecord:
        def body(db: Db) -> RequestRecord:
            t = db.now()
            db.execute(
                "INSERT INTO pool_requests (home, run_id, step, host, priority, gpus, gpu_memory,"
                " cpus, memory, submitted_at, reason, lease_until, accelerator) VALUES (?, ?, ?, ?,"
                " ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (home, run_id, step) DO UPDATE SET"
                " host = excluded.host, priority = excluded.priority, gpus = excluded.gpus,"
                " gpu_memory = excluded.gpu_memory, accelerator = excluded.accelerator,"
                " cpus = excluded.cpus,"
                " memory = excluded.memory, reason = excluded.reason,"
                " lease_until = excluded.lease_until,"
                # An expired request starts a new wait; a live one keeps its place in line.
                " submitted_at = CASE WHEN pool_requests.lease_until > ?"
                " THEN pool_requests.submitted_at ELSE excluded.submitted_at END",
                (home, run_id, step, host, int(priority), need.gpus, need.gpu_memory,
                 float(need.cpus), int(need.memory), t, reason, t + ttl_s, need.accelerator, t),
            )
            row = db.execute("SELECT * FROM pool_requests WHERE home = ? AND run_id = ? AND step = ?",
                             (home, run_id, step)).fetchone()
            return _request(row)

        return self._write(body)

    def drop_requests(self, home: str, run_id: str, step: str | None = None) -> None:
        if step is None:
            self._write(lambda db: db.execute(
                "DELETE FROM pool_requests WHERE home = ? AND run_id = ?", (home, run_id)))
        else:
            self._write(lambda db: db.execute(
                "DELETE FROM pool_requests WHERE home = ? AND run_id = ? AND step = ?",
                (home, run_id, step)))

    def list_requests(self, host: str | None = None) -> list[RequestRecord]:
        return self._read(lambda db: _requests(db, host, db.now()))

    # -- preemption ------------------------------------------------------------
    def request_preemption(self, home: str, run_id: str, *, by_home: str, by_run: str,
                           reason: str, ttl_s: float,
                           devices: Sequence[int] | None = None) -> PreemptionRequest:
        def body(db: Db) -> PreemptionRequest:
            t = db.now()
            row = db.execute(
                "INSERT INTO preemptions (home, run_id, by_home, by_run, reason, created_at,"
                " lease_until, devices) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
                (home, run_id, by_home, by_run, reason, t, t + ttl_s,
                 None if devices is None else json.dumps(sorted(int(d) for d in devices)))
            ).fetchone()
            return _preemption(row)

        return self._write(body)

    def pending_preemptions(self, home: str, run_id: str) -> list[PreemptionRequest]:
        return self._read(lambda db: [_preemption(r) for r in db.execute(
            "SELECT * FROM preemptions WHERE home = ? AND run_id = ? AND outcome IS NULL"
            " AND lease_until > ? ORDER BY id", (home, run_id, db.now()))])

    def preemption(self, request_id: int) -> PreemptionRequest | None:
        def body(db: Db) -> PreemptionRequest | None:
            row = db.execute("SELECT * FROM preemptions WHERE id = ?", (request_id,)).fetchone()
            return None if row is None else _preemption(row)

        return self._read(body)

    def answer_preemption(self, request_id: int, outcome: str) -> None:
        self._write(lambda db: db.execute(
            "UPDATE preemptions SET outcome = ?, handled_at = ? WHERE id = ? AND outcome IS NULL",
            (outcome, db.now(), request_id)))

    def park(self, home: str, run_id: str) -> None:
        self._write(lambda db: db.execute(
            "INSERT INTO parked (home, run_id, since) VALUES (?, ?, ?)"
            " ON CONFLICT (home, run_id) DO NOTHING", (home, run_id, db.now())))

    def unpark(self, home: str, run_id: str) -> None:
        self._write(lambda db: db.execute(
            "DELETE FROM parked WHERE home = ? AND run_id = ?", (home, run_id)))

    def parked(self) -> list[tuple[str, str]]:
        return self._read(lambda db: [
            (r["home"], r["run_id"])
            for r in db.execute("SELECT home, run_id FROM parked ORDER BY since, home, run_id")])


class _SqliteDb:
    """One SQLite transaction as the pool's SQL sees it."""

    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self.conn, self._clock = conn, clock
        self._t: float | None = None

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def now(self) -> float:
        if self._t is None:
            self._t = self._clock()
        return self._t


class SQLiteHostPool(PerThreadConnection, SqlHostPool):
    """The host pool in one SQLite file. Picklable: it travels as its path."""

    def __init__(self, path: str | Path, *, clock: Clock = now) -> None:
        self.path = Path(path)
        self._clock = clock
        self._local = threading.local()
        self._conn()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self.path),))

    def __repr__(self) -> str:
        return f"SQLiteHostPool({str(self.path)!r})"

    def _open(self) -> sqlite3.Connection:
        fresh = not self.path.exists()
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the host pool {self.path}: {e}; set {POOL_ENV} or "
                             "--pool to a writable path") from e
        try:
            if fresh and self.path.parent == SHARED_DIR:
                # Shared by the users of the machine: whoever may write the
                # directory may use the pool. SQLite gives its -wal and -shm
                # files the database file's mode.
                os.chmod(self.path, 0o664 if (SHARED_DIR.stat().st_mode & 0o020) == 0 else 0o660)
            configure(conn)  # synchronous=FULL: an allocation must survive power loss
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > VERSION:
                    raise StoreError(f"the host pool {self.path} is from a newer segue (schema "
                                     f"{version}); upgrade segue or set {POOL_ENV} to another file")
                if version < VERSION:
                    for step, statements in _STEPS:
                        if step > version:
                            for stmt in statements:
                                conn.execute(stmt)
                    conn.execute(f"PRAGMA user_version = {VERSION}")  # an int of this module
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"cannot use the host pool {self.path}: {e}") from e
        except BaseException:
            conn.close()
            raise
        return conn

    def _write(self, body: Callable[[Db], T]) -> T:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(_SqliteDb(conn, self._clock))
            conn.execute("COMMIT")
            return result
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _read(self, body: Callable[[Db], T]) -> T:
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            return body(_SqliteDb(conn, self._clock))
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")


def shared_part(need: Need, other_home: bool) -> Need:
    """What of ``need`` competes with a run of another home: its devices only."""
    return Need(gpus=need.gpus, gpu_memory=need.gpu_memory,
                accelerator=need.accelerator) if other_home else need


def never_fits(need: Need, hp: HostPool) -> str | None:
    """Why ``need`` can never run on this host as configured, or None."""
    if need.gpus <= 0:
        return None
    kind = kinds(hp)
    typed = [d for d in hp.devices if kind_matches(kind[d.index], need.accelerator)]
    big = [d for d in typed if d.memory >= (need.gpu_memory or 0)]
    if len(big) >= need.gpus:
        return None
    gpus = Need(gpus=need.gpus, gpu_memory=need.gpu_memory, accelerator=need.accelerator).describe()
    if need.accelerator and len(typed) < need.gpus:
        counts: dict[str, int] = {}
        for k in kind.values():
            counts[k] = counts.get(k, 0) + 1
        types = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no gpus"
        return f"needs {gpus} but host {hp.host!r} has {types}; it can never run here"
    have = f"{len(typed)} {need.accelerator + ' ' if need.accelerator else ''}gpu" \
           f"{'' if len(typed) == 1 else 's'}"
    if need.gpu_memory and len(typed) >= need.gpus:
        have += f", {len(big)} with >= {gib(need.gpu_memory)}"
    return f"needs {gpus} but host {hp.host!r} has {have}; it can never run here"


def pool_summary(hp: HostPool) -> dict[str, Any]:
    """What a pool change records of a host's configuration (before and after)."""
    return {"source": hp.source, "cpus": hp.cpus, "memory": hp.memory, "gpus": len(hp.devices),
            "gpu_memory": sorted({d.memory for d in hp.devices}),
            "virtual": sum(1 for d in hp.devices if d.virtual)}


def _os_user() -> str:
    """The login name of this process's user (the pool is shared by the machine's users)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return f"uid {os.geteuid()}"


def _where(other: str, home: str) -> str:
    return "" if other == home else f" of home {other}"
