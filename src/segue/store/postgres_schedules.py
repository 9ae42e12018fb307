"""Schedules on PostgreSQL (see ``Store.fire_slot``): READ COMMITTED, the schedule's row
locked (``FOR UPDATE``) before its last slot is judged, so of several agents firing the
same slot one creates the run and the others wait on the lock, then find the slot taken.
Times are the database's clock, read after the lock. Lock order: the schedule, then a run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from . import schedules_rows as rows
from .base import NewRun, RunRecord
from .postgres_schema import Tx, insert_event, insert_run, lock_run
from .records import run_record


def _existing(tx: Tx, name: str, *, lock: bool = False) -> Any:
    row = tx.one("SELECT * FROM schedules WHERE name = %s" + (" FOR UPDATE" if lock else ""), (name,))
    if row is None:
        raise rows.unknown_error(name)
    return row


class PostgresSchedulesMixin:
    _write: Any
    _read: Any

    def add_schedule(self, schedule: rows.NewSchedule, *, actor: str) -> rows.ScheduleRecord:
        def body(tx: Tx) -> rows.ScheduleRecord:
            marks = ", ".join(["%s"] * 12)
            row = tx.one(f"INSERT INTO schedules ({rows.INSERT_COLUMNS}) VALUES ({marks})"
                         " ON CONFLICT (name) DO NOTHING RETURNING *",
                         rows.new_values(schedule, actor=actor, t=tx.now()))
            if row is None:
                raise rows.exists_error(schedule.name)
            return rows.schedule_record(row)

        return cast(rows.ScheduleRecord, self._write(body))

    def get_schedule(self, name: str) -> rows.ScheduleRecord:
        return cast(rows.ScheduleRecord, self._read(lambda tx: rows.schedule_record(_existing(tx, name))))

    def list_schedules(self) -> list[rows.ScheduleRecord]:
        return cast(list[rows.ScheduleRecord], self._read(
            lambda tx: [rows.schedule_record(r) for r in tx.all("SELECT * FROM schedules ORDER BY name")]))

    def set_schedule_paused(self, name: str, paused: bool, *, actor: str) -> rows.ScheduleRecord:
        def body(tx: Tx) -> rows.ScheduleRecord:
            _existing(tx, name, lock=True)
            return rows.schedule_record(tx.one(
                "UPDATE schedules SET paused = %s, updated_at = %s WHERE name = %s RETURNING *",
                (int(bool(paused)), tx.now(), name)))

        return cast(rows.ScheduleRecord, self._write(body))

    def remove_schedule(self, name: str, *, actor: str) -> None:
        def body(tx: Tx) -> None:
            if tx.one("DELETE FROM schedules WHERE name = %s RETURNING name", (name,)) is None:
                raise rows.unknown_error(name)

        self._write(body)

    def fire_slot(self, name: str, slot: float, run: NewRun, steps: Sequence[str], *,
                  actor: str) -> RunRecord | None:
        steps = list(steps)

        def body(tx: Tx) -> RunRecord | None:
            if not rows.slot_open(_existing(tx, name, lock=True), slot):
                return None  # fired (or skipped) already, by this agent or another; or paused
            t = tx.now()
            row = insert_run(tx, run, steps, actor=actor, reason=f"run created by schedule {name!r}",
                             data=rows.fired_event_data(name, slot, steps))
            if row is None:
                # A run of that id exists (a schedule of the same name fired it before it
                # was removed and added again): the slot is taken; say so on the schedule.
                tx.one("UPDATE schedules SET last_slot = %s, last_error = %s, updated_at = %s"
                       " WHERE name = %s RETURNING name", (slot, f"run {run.run_id!r} already exists", t, name))
                return None
            tx.one("UPDATE schedules SET last_slot = %s, last_run = %s, last_error = NULL, updated_at = %s"
                   " WHERE name = %s RETURNING name", (slot, run.run_id, t, name))
            return run_record(cast(Any, row))

        return cast("RunRecord | None", self._write(body))

    def skip_slot(self, name: str, slot: float, *, actor: str, reason: str,
                  run_id: str | None = None, error: str | None = None) -> bool:
        def body(tx: Tx) -> bool:
            if not rows.slot_open(_existing(tx, name, lock=True), slot):
                return False
            t = tx.now()
            tx.one("UPDATE schedules SET last_slot = %s, last_error = %s, updated_at = %s"
                   " WHERE name = %s RETURNING name", (slot, error, t, name))
            if run_id is not None and tx.one("SELECT 1 FROM runs WHERE run_id = %s", (run_id,)):
                lock_run(tx, run_id)  # a run's events are written under its row lock
                insert_event(tx, run_id, "schedule", actor=actor, reason=reason, t=t,
                             data={"schedule": name, "slot": slot, "skipped": True})
            return True

        return cast(bool, self._write(body))
