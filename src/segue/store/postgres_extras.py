"""The home's side of scheduling on PostgreSQL (mixed into PostgresStore), as
:mod:`segue.store.sqlite_pool` is for SQLite: run statistics, the start of a
placed attempt, and the local view of this home's waiting requests.

Same semantics and messages as the SQLite mixin, with PostgresStore's rules:
writes lock the run's row first (so a placed start is fenced and its event id
drawn in the run's commit order), and times are the database's clock plus the
store's offset (``Tx.now()``), never the client's.

Not here (still SQLite-only, see docs/ARCHITECTURE.md): the webhook outbox and
the /metrics event reader, which page over every run's events by id; on
PostgreSQL, ids are commit-ordered only within a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from ..placement.policy import Need
from .base import TaskRecord
from .pool import RequestRecord
from .postgres_schema import Row, Tx, apply_task_move, lock_run, task_row
from .transitions import start_move

T = TypeVar("T")


def start_attempt_in(tx: Tx, run_id: str, step: str, *, ttl_s: float, actor: str,
                     data: Mapping[str, Any] | None = None) -> TaskRecord:
    """The body of start_attempt, inside the caller's write: run then task row locked,
    so two starters get distinct epochs and the second is refused by the state it sees."""
    lock_run(tx, run_id)
    row = task_row(tx, run_id, step, lock=True)
    return apply_task_move(tx, run_id, step, start_move(step, ttl_s=ttl_s, actor=actor, data=data), row)


class PostgresPoolMixin:
    _write: Callable[[Callable[[Tx], Any]], Any]  # provided by PostgresStore
    _read: Callable[[Callable[[Tx], Any]], Any]
    home: str  # the home this store was opened for ("" when built from a bare URL)

    def start_placed_attempt(
        self, run_id: str, step: str, *, ttl_s: float, actor: str, data: Mapping[str, Any],
    ) -> TaskRecord:
        """Start an attempt for which the host pool already allocated resources."""
        def body(tx: Tx) -> TaskRecord:
            task = start_attempt_in(tx, run_id, step, ttl_s=ttl_s, actor=actor, data=data)
            tx.one("DELETE FROM requests WHERE run_id = %s AND step = %s RETURNING step",
                   (run_id, step))
            return task

        return cast(TaskRecord, self._write(body))

    # -- the local view of waiting requests ------------------------------------
    def upsert_request(
        self, run_id: str, step: str, *, host: str, need: Need, priority: int, reason: str,
        ttl_s: float,
    ) -> RequestRecord:
        def body(tx: Tx) -> RequestRecord:
            t = tx.now()
            row = tx.one(
                "INSERT INTO requests AS q (run_id, step, host, priority, gpus, gpu_memory, cpus,"
                " memory, submitted_at, reason, lease_until)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (run_id, step) DO UPDATE SET host = excluded.host,"
                " priority = excluded.priority, gpus = excluded.gpus,"
                " gpu_memory = excluded.gpu_memory, cpus = excluded.cpus,"
                " memory = excluded.memory, reason = excluded.reason,"
                " lease_until = excluded.lease_until,"
                " submitted_at = CASE WHEN q.lease_until > %s THEN q.submitted_at"
                " ELSE excluded.submitted_at END RETURNING *",
                (run_id, step, host, int(priority), need.gpus, need.gpu_memory, float(need.cpus),
                 int(need.memory), t, reason, t + ttl_s, t))
            return self._request(cast(Row, row))

        return cast(RequestRecord, self._write(body))

    def drop_request(self, run_id: str, step: str | None = None) -> None:
        def body(tx: Tx) -> None:
            tx.one("DELETE FROM requests WHERE run_id = %s AND (%s::text IS NULL OR step = %s)"
                   " RETURNING step", (run_id, step, step))

        self._write(body)

    def list_requests(self, host: str | None = None) -> list[RequestRecord]:
        """This home's live waiting requests, best-ranked first (live by the database's clock)."""
        def body(tx: Tx) -> list[RequestRecord]:
            rows = tx.all(
                "SELECT * FROM requests WHERE lease_until >"
                " extract(epoch FROM clock_timestamp())::float8 + %s"
                " AND (%s::text IS NULL OR host = %s) ORDER BY priority DESC, submitted_at ASC",
                (tx.offset, host, host))
            return [self._request(r) for r in rows]

        return cast(list[RequestRecord], self._read(body))

    def _request(self, r: Row) -> RequestRecord:
        return RequestRecord(
            home=self.home, run_id=r["run_id"], step=r["step"], host=r["host"],
            priority=r["priority"],
            need=Need(gpus=r["gpus"], gpu_memory=r["gpu_memory"], cpus=r["cpus"], memory=r["memory"]),
            submitted_at=r["submitted_at"], reason=r["reason"], lease_until=r["lease_until"],
        )

    # -- run statistics ----------------------------------------------------------
    def add_stats(self, run_id: str, deltas: Mapping[str, float]) -> None:
        self._put_stats(run_id, deltas, "s.value + excluded.value")

    def set_stats(self, run_id: str, values: Mapping[str, float]) -> None:
        self._put_stats(run_id, values, "excluded.value")

    def _put_stats(self, run_id: str, values: Mapping[str, float], merge: str) -> None:
        items = [(run_id, k, float(v)) for k, v in values.items()]

        def body(tx: Tx) -> None:
            with tx.conn.cursor() as cur:  # one statement per key, one transaction
                cur.executemany(
                    "INSERT INTO run_stats AS s (run_id, key, value) VALUES (%s, %s, %s)"
                    f" ON CONFLICT (run_id, key) DO UPDATE SET value = {merge}",  # fixed text
                    items)

        if items:
            self._write(body)

    def get_stats(self, run_id: str) -> dict[str, float]:
        rows = self._read(lambda tx: tx.all(
            "SELECT key, value FROM run_stats WHERE run_id = %s", (run_id,)))
        return {r["key"]: float(r["value"]) for r in rows}

