"""Step metrics on SQLite (``Store.put_metrics`` / ``get_metrics``): what steps log
with ``ctx.log_metrics``, keyed by (run, step, name, index).

A write is one ``BEGIN IMMEDIATE`` transaction that checks the attempt's epoch
first (a zombie's points are refused, invariant 2), then upserts: a resumed
attempt redoing a step replaces its point. The converters here are shared with
the PostgreSQL store (:mod:`segue.store.postgres_step_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .base import MetricPoint
from .sqlite_rows import _fetch_run, _fetch_task
from .transitions import check_epoch

Points = Sequence[tuple[str, int, float | None]]


def newest_per_name(points: Points) -> list[tuple[str, float | None]]:
    """The last point of each name in ``points`` (the caller's logging order), sorted by
    name: the flow's latest values, written in one lock order by every writer."""
    last: dict[str, float | None] = {}
    for name, _, value in points:
        last[name] = value
    return sorted(last.items())


def point_record(r: Mapping[str, Any]) -> MetricPoint:
    return MetricPoint(run_id=r["run_id"], step=r["step"], name=r["name"], index=int(r["idx"]),
                       value=None if r["value"] is None else float(r["value"]), epoch=int(r["epoch"]),
                       time=float(r["time"]))


def select_points(mark: str, step: str | None, since: float | None) -> tuple[str, list[str]]:
    """The query of ``get_metrics`` with ``mark`` as the placeholder, and which of
    (step, since) it binds after the run id."""
    sql = ("SELECT m.* FROM step_metrics m JOIN tasks t ON t.run_id = m.run_id AND t.step = m.step"
           f" WHERE m.run_id = {mark}")
    binds: list[str] = []
    if step is not None:
        sql += f" AND m.step = {mark}"
        binds.append("step")
    if since is not None:
        sql += f" AND m.time > {mark}"
        binds.append("since")
    return sql + " ORDER BY t.ord, m.name, m.idx", binds


UPSERT = ("INSERT INTO step_metrics (run_id, step, name, idx, value, epoch, time)"
          " VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m}) ON CONFLICT (run_id, step, name, idx)"
          " DO UPDATE SET value = excluded.value, epoch = excluded.epoch, time = excluded.time")
UPSERT_LATEST = ("INSERT INTO step_metrics_latest (flow_name, step, name, value, time)"
                 " VALUES ({m}, {m}, {m}, {m}, {m}) ON CONFLICT (flow_name, step, name)"
                 " DO UPDATE SET value = excluded.value, time = excluded.time")


def rows(run_id: str, step: str, points: Points, epoch: int, t: float) -> Iterable[tuple[Any, ...]]:
    return [(run_id, step, name, int(index), value, epoch, t) for name, index, value in points]


class SQLiteStepMetricsMixin:
    _write: Any
    _read: Any
    _clock: Any

    def put_metrics(self, run_id: str, step: str, points: Points, *, epoch: int) -> int:
        if not points:
            return 0
        with self._write() as conn:
            check_epoch(run_id, step, _fetch_task(conn, run_id, step), epoch)
            t = self._clock()
            conn.executemany(UPSERT.format(m="?"), rows(run_id, step, points, epoch, t))
            flow = _fetch_run(conn, run_id)["flow_name"]
            conn.executemany(UPSERT_LATEST.format(m="?"),
                             [(flow, step, name, value, t) for name, value in newest_per_name(points)])
            return len(points)

    def get_metrics(self, run_id: str, step: str | None = None, *,
                    since: float | None = None) -> list[MetricPoint]:
        sql, binds = select_points("?", step, since)
        args: list[Any] = [run_id] + [step if b == "step" else since for b in binds]
        with self._read() as conn:
            if step is None:
                _fetch_run(conn, run_id)
            else:
                _fetch_task(conn, run_id, step)
            return [point_record(r) for r in conn.execute(sql, args)]
