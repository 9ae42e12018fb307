"""Step metrics on PostgreSQL (``Store.put_metrics`` / ``get_metrics``), as on SQLite
(:mod:`segue.store.sqlite_step_metrics`): READ COMMITTED, the task's row locked
before its epoch is judged, then an upsert. The latest values are upserted in name
order, so two runs of one flow writing at once lock those rows in the same order.
"""

from __future__ import annotations

from typing import Any, cast

from .base import MetricPoint
from .postgres_schema import Tx, fence, run_row, task_row
from .sqlite_step_metrics import (
    UPSERT,
    UPSERT_LATEST,
    Points,
    newest_per_name,
    point_record,
    rows,
    select_points,
)


class PostgresStepMetricsMixin:
    _write: Any
    _read: Any

    def put_metrics(self, run_id: str, step: str, points: Points, *, epoch: int) -> int:
        if not points:
            return 0

        def body(tx: Tx) -> int:
            fence(run_id, step, task_row(tx, run_id, step, lock=True), epoch)
            t = tx.now()
            flow = run_row(tx, run_id)["flow_name"]
            with tx.conn.cursor() as cur:
                cur.executemany(UPSERT.format(m="%s"), rows(run_id, step, points, epoch, t))  # type: ignore[arg-type]
                cur.executemany(UPSERT_LATEST.format(m="%s"),  # type: ignore[arg-type]
                                [(flow, step, name, value, t) for name, value in newest_per_name(points)])
            return len(points)

        return cast(int, self._write(body))

    def get_metrics(self, run_id: str, step: str | None = None, *,
                    since: float | None = None) -> list[MetricPoint]:
        sql, binds = select_points("%s", step, since)
        args: list[Any] = [run_id] + [step if b == "step" else since for b in binds]

        def body(tx: Tx) -> list[MetricPoint]:
            got = tx.all(sql, args)
            if not got:  # none yet, or no such run or step: say which
                if step is None:
                    run_row(tx, run_id)
                else:
                    task_row(tx, run_id, step)
            return [point_record(r) for r in got]

        return cast(list[MetricPoint], self._read(body))
