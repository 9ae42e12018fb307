"""Read-only queries behind /metrics: aggregates computed in SQL, and the event log in pages.

Two kinds of figure, each kept cheap with thousands of runs:

- *now* figures (runs by state, bytes of live checkpoints, records processed,
  webhook deliveries) are GROUP BY / SUM queries over small sets: the runs
  table, and the checkpoints that are not pruned (indexed by status since
  schema version 3; retention keeps a few per step);
- *since ever* counters (attempts, checkpoints, preemptions, pause latency)
  come from the event log, which the caller reads once and then only past
  the last commit position it saw (:meth:`MetricsReader.events_after`), so a
  scrape costs the events written since the previous one. On SQLite the
  position is the event id (one writer commits ids in order); PostgreSQL's
  reader (:mod:`segue.store.postgres_metrics`) pages by transaction instead.

Nothing here writes (the connection's migration aside, as every opener does).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .migrations import connect
from .sqlite_rows import PerThreadConnection

EVENT_PAGE = 20_000


@dataclass(frozen=True)
class MetricEvent:
    """The columns of an event that the counters need; data fields pre-extracted in SQL."""

    id: int
    run_id: str
    time: float
    actor: str
    kind: str
    from_state: str | None
    to_state: str | None
    nbytes: float | None  # a checkpoint commit's size
    duration_s: float | None  # a checkpoint commit's save duration (recorded since v3)
    pos: int  # its commit position: a reader that consumed it reads on from here (SQLite: the id)


@dataclass(frozen=True)
class Now:
    """Figures of the store as it is."""

    runs_by_state: dict[str, int] = field(default_factory=dict)
    live_checkpoint_bytes: dict[str, int] = field(default_factory=dict)  # committed / quarantined
    records: dict[str, float] = field(default_factory=dict)  # records_in / records_out / failures
    deliveries: dict[str, int] = field(default_factory=dict)  # webhook outbox, by status
    # ctx.log_metrics: the newest value per (flow, step, metric), whichever run wrote it
    step_metrics: list[tuple[str, str, str, float | None]] = field(default_factory=list)


class MetricsReader(PerThreadConnection):
    """Read-only aggregate queries over one home's ``segue.db``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()

    def _open(self) -> sqlite3.Connection:
        return connect(self.path)  # an older home is migrated here

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def now(self) -> Now:
        """The *now* figures, in one read snapshot."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            runs = {r[0]: int(r[1]) for r in conn.execute(
                "SELECT state, COUNT(*) FROM runs GROUP BY state")}
            live = {r[0]: int(r[1] or 0) for r in conn.execute(
                "SELECT status, SUM(nbytes) FROM checkpoints WHERE status IN ('committed','quarantined')"
                " GROUP BY status")}
            # The newest committed checkpoint of each data step says how many records it has
            # processed so far (its position carries the step's counters).
            rec = conn.execute(
                "SELECT SUM(json_extract(c.position, '$.records_in')),"
                " SUM(json_extract(c.position, '$.records_out')),"
                " SUM(json_extract(c.position, '$.failures'))"
                " FROM checkpoints c WHERE c.status = 'committed' AND json_valid(c.position)"
                " AND c.seq = (SELECT MAX(seq) FROM checkpoints d WHERE d.run_id = c.run_id"
                " AND d.step = c.step AND d.status = 'committed')").fetchone()
            deliveries = {r[0]: int(r[1]) for r in conn.execute(
                "SELECT status, COUNT(*) FROM notify_outbox GROUP BY status")}
            latest = [(r[0], r[1], r[2], r[3]) for r in conn.execute(
                "SELECT flow_name, step, name, value FROM step_metrics_latest"
                " ORDER BY flow_name, step, name")]
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        return Now(runs_by_state=runs, live_checkpoint_bytes=live,
                   records={"records_in": float(rec[0] or 0), "records_out": float(rec[1] or 0),
                            "failures": float(rec[2] or 0)},
                   deliveries=deliveries, step_metrics=latest)

    def last_position(self) -> int:
        """The newest event's commit position, its id (0 for none)."""
        return int(self._query("SELECT COALESCE(MAX(id), 0) FROM events")[0][0])

    def events_after(self, after: int, upto: int, *, limit: int = EVENT_PAGE) -> list[MetricEvent]:
        """Run, task and checkpoint events with commit positions (ids) ``after < id <= upto``,
        oldest first, at most ``limit`` (page on from the last ``pos`` returned)."""
        rows = self._query(
            "SELECT id, run_id, time, actor, kind, from_state, to_state,"
            " CASE WHEN kind = 'checkpoint' AND to_state IS NULL AND json_valid(data)"
            "  THEN json_extract(data, '$.nbytes') END,"
            " CASE WHEN kind = 'checkpoint' AND to_state IS NULL AND json_valid(data)"
            "  THEN json_extract(data, '$.duration_s') END"
            " FROM events WHERE id > ? AND id <= ? AND kind IN ('run', 'task', 'checkpoint')"
            " ORDER BY id LIMIT ?", (after, upto, limit))
        return [MetricEvent(id=r[0], run_id=r[1], time=r[2], actor=r[3], kind=r[4], from_state=r[5],
                            to_state=r[6], nbytes=r[7], duration_s=r[8], pos=r[0]) for r in rows]
