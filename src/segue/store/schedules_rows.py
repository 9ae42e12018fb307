"""Schedules in the store (``segue schedule``), the rules both backends share: the
records, the refusals, and the fence of a slot.

A schedule's row holds its last slot: the newest slot that was fired (its run
created) or skipped. ``Store.fire_slot`` creates a slot's run, under its
deterministic id, only if the slot is newer than that, and moves it in the same
transaction: of several agents firing the same slot, one creates the run and the
others find the slot taken and create nothing. When to fire and what a slot does
while the previous run still runs are decided above the store
(:mod:`segue.scheduler.schedules`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .._canon import canonical_json
from ..errors import NotFoundError, UsageError


@dataclass(frozen=True)
class NewSchedule:
    """What the caller supplies to add a schedule (validated by the caller)."""

    name: str
    flow_path: str  # absolute
    cron: str
    tz: str = "UTC"
    params: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # RunOptions.to_json()
    catch_up: str = "none"
    overlap: str = "skip"


@dataclass(frozen=True)
class ScheduleRecord:
    name: str
    flow_path: str
    params: dict[str, Any]
    options: dict[str, Any]
    cron: str
    tz: str
    catch_up: str  # none | latest | all
    overlap: str  # skip | queue | cancel
    paused: bool
    created_at: float
    created_by: str
    updated_at: float
    last_slot: float | None  # the newest slot fired or skipped
    last_run: str | None  # the run of the newest slot fired
    last_error: str | None  # why the newest slot could not fire (a flow that no longer loads)


def schedule_record(r: Any) -> ScheduleRecord:
    return ScheduleRecord(
        name=r["name"], flow_path=r["flow_path"], params=json.loads(r["params"]),
        options=json.loads(r["options"]), cron=r["cron"], tz=r["tz"], catch_up=r["catch_up"],
        overlap=r["overlap"], paused=bool(r["paused"]), created_at=float(r["created_at"]),
        created_by=r["created_by"], updated_at=float(r["updated_at"]),
        last_slot=None if r["last_slot"] is None else float(r["last_slot"]),
        last_run=r["last_run"], last_error=r["last_error"])


def new_values(s: NewSchedule, *, actor: str, t: float) -> tuple[Any, ...]:
    """The row of a new schedule, in the order of :data:`INSERT_COLUMNS`."""
    return (s.name, s.flow_path, canonical_json(s.params), canonical_json(s.options), s.cron, s.tz,
            s.catch_up, s.overlap, 0, t, str(actor), t)


INSERT_COLUMNS = ("name, flow_path, params, options, cron, tz, catch_up, overlap, paused, created_at,"
                  " created_by, updated_at")


def exists_error(name: str) -> UsageError:
    return UsageError(f"schedule {name!r} already exists; `segue schedule rm {name}` first, or pick "
                      "another name")


def unknown_error(name: str) -> NotFoundError:
    return NotFoundError(f"unknown schedule {name!r}; `segue schedule ls` lists them")


def slot_open(row: Any, slot: float) -> bool:
    """Whether ``slot`` may still be fired or skipped: the schedule is not paused and the
    slot is newer than its last one. Judged on the row locked in the firing transaction."""
    if row is None or bool(row["paused"]):
        return False
    return row["last_slot"] is None or float(row["last_slot"]) < slot


def fired_event_data(name: str, slot: float, steps: list[str]) -> dict[str, Any]:
    return {"steps": steps, "schedule": name, "slot": slot}
