"""Schedules on SQLite (see ``Store.fire_slot``): ``BEGIN IMMEDIATE`` serialises every
judgement of a schedule's last slot with the write that moves it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import NewRun, RunRecord
from .records import run_record
from .schedules_rows import (
    INSERT_COLUMNS,
    NewSchedule,
    ScheduleRecord,
    exists_error,
    fired_event_data,
    new_values,
    schedule_record,
    slot_open,
    unknown_error,
)
from .sqlite_rows import _fetch_run, _insert_event, insert_run


def _row(conn: Any, name: str) -> Any:
    return conn.execute("SELECT * FROM schedules WHERE name = ?", (name,)).fetchone()


def _existing(conn: Any, name: str) -> Any:
    row = _row(conn, name)
    if row is None:
        raise unknown_error(name)
    return row


class SQLiteSchedulesMixin:
    _write: Any
    _read: Any
    _clock: Any

    def add_schedule(self, schedule: NewSchedule, *, actor: str) -> ScheduleRecord:
        with self._write() as conn:
            if _row(conn, schedule.name) is not None:
                raise exists_error(schedule.name)
            conn.execute(f"INSERT INTO schedules ({INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         new_values(schedule, actor=actor, t=self._clock()))
            return schedule_record(_row(conn, schedule.name))

    def get_schedule(self, name: str) -> ScheduleRecord:
        with self._read() as conn:
            return schedule_record(_existing(conn, name))

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._read() as conn:
            return [schedule_record(r) for r in conn.execute("SELECT * FROM schedules ORDER BY name")]

    def set_schedule_paused(self, name: str, paused: bool, *, actor: str) -> ScheduleRecord:
        with self._write() as conn:
            _existing(conn, name)
            conn.execute("UPDATE schedules SET paused = ?, updated_at = ? WHERE name = ?",
                         (int(bool(paused)), self._clock(), name))
            return schedule_record(_row(conn, name))

    def remove_schedule(self, name: str, *, actor: str) -> None:
        with self._write() as conn:
            _existing(conn, name)
            conn.execute("DELETE FROM schedules WHERE name = ?", (name,))

    def fire_slot(self, name: str, slot: float, run: NewRun, steps: Sequence[str], *,
                  actor: str) -> RunRecord | None:
        steps = list(steps)
        with self._write() as conn:
            if not slot_open(_existing(conn, name), slot):
                return None  # fired (or skipped) already, by this agent or another; or paused
            t = self._clock()
            if not insert_run(conn, run, steps, t, actor=actor, reason=f"run created by schedule {name!r}",
                              data=fired_event_data(name, slot, steps)):
                # A run of that id exists (a schedule of the same name fired it before it
                # was removed and added again): the slot is taken; say so on the schedule.
                conn.execute("UPDATE schedules SET last_slot = ?, last_error = ?, updated_at = ?"
                             " WHERE name = ?", (slot, f"run {run.run_id!r} already exists", t, name))
                return None
            conn.execute("UPDATE schedules SET last_slot = ?, last_run = ?, last_error = NULL,"
                         " updated_at = ? WHERE name = ?", (slot, run.run_id, t, name))
            return run_record(_fetch_run(conn, run.run_id))

    def skip_slot(self, name: str, slot: float, *, actor: str, reason: str,
                  run_id: str | None = None, error: str | None = None) -> bool:
        with self._write() as conn:
            if not slot_open(_existing(conn, name), slot):
                return False
            t = self._clock()
            conn.execute("UPDATE schedules SET last_slot = ?, last_error = ?, updated_at = ?"
                         " WHERE name = ?", (slot, error, t, name))
            if run_id is not None and conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                _insert_event(conn, run_id, "schedule", actor=actor, reason=reason, t=t,
                              data={"schedule": name, "slot": slot, "skipped": True})
            return True
