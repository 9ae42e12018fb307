"""SQLite implementation of the resource-pool contract (mixed into SQLiteStore)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..scheduler.policy import Capacity, Device, Need, place
from ..states import Actor
from .base import now
from .pool import (
    AllocationRecord,
    Denied,
    DeviceRecord,
    HostPool,
    Placement,
    PoolStore,
    RequestRecord,
)

_LIVE = "released_at IS NULL AND lease_until > ?"


class SQLitePoolMixin(PoolStore):
    _write: Any  # provided by SQLiteStore: () -> context manager yielding a connection
    _read: Any

    def configure_host(
        self, host: str, *, cpus: float, memory: int,
        devices: Sequence[tuple[str, int, bool]], source: str,
    ) -> HostPool:
        if cpus <= 0 or memory < 0:
            raise ValueError("a host needs cpus > 0 and memory >= 0")
        with self._write() as conn:
            t = now()
            conn.execute(
                "INSERT INTO pool_hosts (host, cpus, memory, source, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (host) DO UPDATE SET cpus = excluded.cpus, memory = excluded.memory,"
                " source = excluded.source, updated_at = excluded.updated_at",
                (host, float(cpus), int(memory), source, t),
            )
            conn.execute("DELETE FROM pool_devices WHERE host = ?", (host,))
            conn.executemany(
                "INSERT INTO pool_devices (host, device, name, memory, virtual) VALUES (?, ?, ?, ?, ?)",
                [(host, i, name, int(mem), int(virtual)) for i, (name, mem, virtual) in enumerate(devices)],
            )
            hp = _host(conn, host)
            assert hp is not None  # just written
            return hp

    def get_host(self, host: str) -> HostPool | None:
        with self._read() as conn:
            return _host(conn, host)

    def list_hosts(self) -> list[HostPool]:
        with self._read() as conn:
            hosts = [r["host"] for r in conn.execute("SELECT host FROM pool_hosts ORDER BY host")]
            return [h for h in (_host(conn, x) for x in hosts) if h is not None]

    def free_capacity(self, host: str) -> Capacity:
        with self._read() as conn:
            return _free(conn, host, now())

    def try_start_attempt(
        self, run_id: str, step: str, *, host: str, need: Need, priority: int,
        preemptible: bool, ttl_s: float, actor: Actor,
    ) -> Placement | Denied:
        from .sqlite_rows import start_attempt_in  # the task half of the same transaction

        with self._write() as conn:
            t = now()
            hp = _host(conn, host)
            if hp is None:
                return Denied(f"host {host!r} is not in the pool; run `segue pool set` or `segue pool detect`")
            if need.gpus > len(hp.devices):
                return Denied(f"needs {need.gpus} gpus but host {host!r} has {len(hp.devices)}; "
                              "it can never run here")
            free = _free(conn, host, t)
            devs = place(need, free)
            if devs is None:
                return Denied(f"waiting for {need.describe()}; free now: {_describe_free(free)}")
            mine = conn.execute("SELECT submitted_at FROM requests WHERE run_id = ? AND step = ?",
                                (run_id, step)).fetchone()
            my_time = mine["submitted_at"] if mine else t
            total = len(hp.devices)
            for r in _requests(conn, host, t):
                if (r.run_id, r.step) == (run_id, step) or r.need.gpus > total:
                    continue  # ourselves, or a request that can never run here
                # No backfilling past a higher class: it would take the capacity a
                # preemptor is freeing, and the urgent run would starve. Within a
                # class, FIFO with backfill for requests that fit anyway.
                if r.priority > priority or (
                    r.priority == priority and r.submitted_at < my_time and place(r.need, free) is not None
                ):
                    return Denied(f"waiting behind run {r.run_id!r} step {r.step!r} "
                                  f"(priority {r.priority}, waiting since {r.submitted_at:.3f})")
            task = start_attempt_in(conn, run_id, step, ttl_s=ttl_s, actor=actor,
                                    data={"devices": devs, "host": host})
            conn.execute(
                "INSERT INTO allocations (host, run_id, step, epoch, devices, cpus, memory, priority,"
                " preemptible, since, lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (host, run_id, step, task.epoch, json.dumps(devs), float(need.cpus), int(need.memory),
                 int(priority), int(preemptible), t, t + ttl_s),
            )
            conn.execute("DELETE FROM requests WHERE run_id = ? AND step = ?", (run_id, step))
            return Placement(task, tuple(devs))

    def release_allocation(self, run_id: str, step: str, epoch: int) -> AllocationRecord | None:
        with self._write() as conn:
            conn.execute(
                "UPDATE allocations SET released_at = ? WHERE run_id = ? AND step = ? AND epoch = ?"
                " AND released_at IS NULL",
                (now(), run_id, step, epoch),
            )
            row = conn.execute("SELECT * FROM allocations WHERE run_id = ? AND step = ? AND epoch = ?",
                               (run_id, step, epoch)).fetchone()
            return None if row is None else _alloc(row)

    def list_allocations(self, host: str | None = None, *, live_only: bool = True) -> list[AllocationRecord]:
        sql, args = "SELECT * FROM allocations WHERE 1 = 1", list[Any]()
        if host is not None:
            sql += " AND host = ?"
            args.append(host)
        if live_only:
            sql += f" AND {_LIVE}"
            args.append(now())
        with self._read() as conn:
            return [_alloc(r) for r in conn.execute(sql + " ORDER BY id", args)]

    def upsert_request(
        self, run_id: str, step: str, *, host: str, need: Need, priority: int, reason: str,
        ttl_s: float,
    ) -> RequestRecord:
        with self._write() as conn:
            t = now()
            conn.execute(
                "INSERT INTO requests (run_id, step, host, priority, gpus, gpu_memory, cpus, memory,"
                " submitted_at, reason, lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, step) DO UPDATE SET host = excluded.host,"
                " priority = excluded.priority, gpus = excluded.gpus, gpu_memory = excluded.gpu_memory,"
                " cpus = excluded.cpus, memory = excluded.memory, reason = excluded.reason,"
                " lease_until = excluded.lease_until,"
                # An expired request starts a new wait; a live one keeps its place in line.
                " submitted_at = CASE WHEN requests.lease_until > ? THEN requests.submitted_at"
                " ELSE excluded.submitted_at END",
                (run_id, step, host, int(priority), need.gpus, need.gpu_memory, float(need.cpus),
                 int(need.memory), t, reason, t + ttl_s, t),
            )
            row = conn.execute("SELECT * FROM requests WHERE run_id = ? AND step = ?",
                               (run_id, step)).fetchone()
            return _request(row)

    def drop_request(self, run_id: str, step: str | None = None) -> None:
        with self._write() as conn:
            if step is None:
                conn.execute("DELETE FROM requests WHERE run_id = ?", (run_id,))
            else:
                conn.execute("DELETE FROM requests WHERE run_id = ? AND step = ?", (run_id, step))

    def list_requests(self, host: str | None = None) -> list[RequestRecord]:
        with self._read() as conn:
            reqs = _requests(conn, host, now())
        return reqs

    def add_stats(self, run_id: str, deltas: Mapping[str, float]) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO run_stats (run_id, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT (run_id, key) DO UPDATE SET value = run_stats.value + excluded.value",
                [(run_id, k, float(v)) for k, v in deltas.items()],
            )

    def set_stats(self, run_id: str, values: Mapping[str, float]) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO run_stats (run_id, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
                [(run_id, k, float(v)) for k, v in values.items()],
            )

    def get_stats(self, run_id: str) -> dict[str, float]:
        with self._read() as conn:
            return {r["key"]: r["value"] for r in
                    conn.execute("SELECT key, value FROM run_stats WHERE run_id = ?", (run_id,))}


def _host(conn: sqlite3.Connection, host: str) -> HostPool | None:
    row = conn.execute("SELECT * FROM pool_hosts WHERE host = ?", (host,)).fetchone()
    if row is None:
        return None
    devs = tuple(
        DeviceRecord(host, d["device"], d["name"], d["memory"], bool(d["virtual"]))
        for d in conn.execute("SELECT * FROM pool_devices WHERE host = ? ORDER BY device", (host,))
    )
    return HostPool(host, row["cpus"], row["memory"], row["source"], devs, row["updated_at"])


def _live_allocs(conn: sqlite3.Connection, host: str, t: float) -> Iterator[AllocationRecord]:
    for r in conn.execute(f"SELECT * FROM allocations WHERE host = ? AND {_LIVE}", (host, t)):
        yield _alloc(r)


def _free(conn: sqlite3.Connection, host: str, t: float) -> Capacity:
    hp = _host(conn, host)
    if hp is None:
        return Capacity((), 0.0, 0)
    busy: set[int] = set()
    cpus, mem = hp.cpus, hp.memory
    for a in _live_allocs(conn, host, t):
        busy.update(a.devices)
        cpus -= a.cpus
        mem -= a.memory
    devices = tuple(Device(d.index, d.memory) for d in hp.devices if d.index not in busy)
    return Capacity(devices, cpus, mem)


def _describe_free(free: Capacity) -> str:
    return f"{len(free.devices)} gpus, {free.cpus:g} cpus, {free.memory / 2**30:.1f} GiB memory"


def _requests(conn: sqlite3.Connection, host: str | None, t: float) -> list[RequestRecord]:
    sql, args = "SELECT * FROM requests WHERE lease_until > ?", list[Any]([t])
    if host is not None:
        sql += " AND host = ?"
        args.append(host)
    sql += " ORDER BY priority DESC, submitted_at ASC"
    return [_request(r) for r in conn.execute(sql, args)]


def _alloc(r: sqlite3.Row) -> AllocationRecord:
    return AllocationRecord(
        id=r["id"], host=r["host"], run_id=r["run_id"], step=r["step"], epoch=r["epoch"],
        devices=tuple(json.loads(r["devices"])), cpus=r["cpus"], memory=r["memory"],
        priority=r["priority"], preemptible=bool(r["preemptible"]), since=r["since"],
        lease_until=r["lease_until"], released_at=r["released_at"],
    )


def _request(r: sqlite3.Row) -> RequestRecord:
    return RequestRecord(
        run_id=r["run_id"], step=r["step"], host=r["host"], priority=r["priority"],
        need=Need(gpus=r["gpus"], gpu_memory=r["gpu_memory"], cpus=r["cpus"], memory=r["memory"]),
        submitted_at=r["submitted_at"], reason=r["reason"], lease_until=r["lease_until"],
    )


