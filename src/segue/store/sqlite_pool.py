"""The home's side of scheduling (mixed into SQLiteStore): run statistics, the
start of a placed attempt, and a local view of this home's waiting requests.

The devices, allocations and the priority queue themselves live in the host
pool (:mod:`segue.store.hostpool`), shared by every home on the machine. The
home keeps a copy of its own runs' waiting reasons only so that `segue status`
and `segue ls` can say WAITING without opening the pool; the pool's queue is
the one that decides.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from ..placement.policy import Need
from .base import TaskRecord, now
from .pool import RequestRecord


class SQLitePoolMixin:
    _write: Any  # provided by SQLiteStore: () -> context manager yielding a connection
    _read: Any
    path: Any

    def _pool_now(self) -> float:
        clock = getattr(self, "_clock", None)
        return clock() if clock is not None else now()

    def start_placed_attempt(
        self, run_id: str, step: str, *, ttl_s: float, actor: str, data: Mapping[str, Any],
    ) -> TaskRecord:
        """Start an attempt for which the host pool already allocated resources."""
        from .sqlite_rows import start_attempt_in

        with self._write() as conn:
            task = start_attempt_in(conn, run_id, step, ttl_s=ttl_s, actor=actor, data=dict(data),
                                    t=self._pool_now())
            conn.execute("DELETE FROM requests WHERE run_id = ? AND step = ?", (run_id, step))
            return task

    # -- the local view of waiting requests ------------------------------------
    def upsert_request(
        self, run_id: str, step: str, *, host: str, need: Need, priority: int, reason: str,
        ttl_s: float,
    ) -> RequestRecord:
        with self._write() as conn:
            t = self._pool_now()
            conn.execute(
                "INSERT INTO requests (run_id, step, host, priority, gpus, gpu_memory, cpus, memory,"
                " submitted_at, reason, lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, step) DO UPDATE SET host = excluded.host,"
                " priority = excluded.priority, gpus = excluded.gpus, gpu_memory = excluded.gpu_memory,"
                " cpus = excluded.cpus, memory = excluded.memory, reason = excluded.reason,"
                " lease_until = excluded.lease_until,"
                " submitted_at = CASE WHEN requests.lease_until > ? THEN requests.submitted_at"
                " ELSE excluded.submitted_at END",
                (run_id, step, host, int(priority), need.gpus, need.gpu_memory, float(need.cpus),
                 int(need.memory), t, reason, t + ttl_s, t),
            )
            row = conn.execute("SELECT * FROM requests WHERE run_id = ? AND step = ?",
                               (run_id, step)).fetchone()
            return self._request(row)

    def drop_request(self, run_id: str, step: str | None = None) -> None:
        with self._write() as conn:
            if step is None:
                conn.execute("DELETE FROM requests WHERE run_id = ?", (run_id,))
            else:
                conn.execute("DELETE FROM requests WHERE run_id = ? AND step = ?", (run_id, step))

    def list_requests(self, host: str | None = None) -> list[RequestRecord]:
        """This home's live waiting requests, best-ranked first."""
        sql, args = "SELECT * FROM requests WHERE lease_until > ?", list[Any]([self._pool_now()])
        if host is not None:
            sql += " AND host = ?"
            args.append(host)
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY priority DESC, submitted_at ASC", args).fetchall()
        return [self._request(r) for r in rows]

    def _request(self, r: sqlite3.Row) -> RequestRecord:
        return RequestRecord(
            home=str(self.path.parent), run_id=r["run_id"], step=r["step"], host=r["host"],
            priority=r["priority"],
            need=Need(gpus=r["gpus"], gpu_memory=r["gpu_memory"], cpus=r["cpus"], memory=r["memory"]),
            submitted_at=r["submitted_at"], reason=r["reason"], lease_until=r["lease_until"],
        )

    # -- run statistics ----------------------------------------------------------
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
