"""Rows to records, and events to rows: the same for both backends.

A row is anything indexed by column name (``sqlite3.Row``, psycopg's dict rows).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Required, TypedDict, Unpack

from .._canon import canonical_json
from ..states import RunState, TaskState
from .base import CheckpointRecord, Event, NewRun, RunRecord, TaskRecord

# The columns of an event row, in the order of :func:`event_values`.
EVENT_COLUMNS = "run_id, step, time, actor, kind, from_state, to_state, reason, data"


class EventFields(TypedDict, total=False):
    """What a backend's ``insert_event`` takes besides the run and the kind."""

    actor: Required[str]
    reason: Required[str]
    t: Required[float]
    step: str | None
    from_state: str | None
    to_state: str | None
    data: dict[str, Any] | None


def event_values(run_id: str, kind: str, **f: Unpack[EventFields]) -> tuple[Any, ...]:
    """An event's row (:data:`EVENT_COLUMNS`), its data as canonical JSON."""
    frm, to = f.get("from_state"), f.get("to_state")
    return (run_id, f.get("step"), f["t"], str(f["actor"]), kind,
            None if frm is None else str(frm), None if to is None else str(to), f["reason"],
            canonical_json(dict(f.get("data") or {})))


# A new run's row and its tasks' (``create_run``, ``fire_slot``, ``record_decision``).
RUN_INSERT = "run_id, flow_name, flow_path, params, fingerprint, options, state, created_at, updated_at"
TASK_INSERT = "run_id, step, ord, state, epoch, updated_at"


def run_values(run: NewRun, t: float) -> tuple[Any, ...]:
    """A new run's row (:data:`RUN_INSERT`): PENDING, created at ``t``."""
    return (run.run_id, run.flow_name, run.flow_path, canonical_json(run.params),
            canonical_json(run.fingerprint), canonical_json(run.options), RunState.PENDING.value, t, t)


def task_values(run_id: str, steps: Sequence[str], t: float, *, first: int = 0,
                epoch: int = 0) -> list[tuple[Any, ...]]:
    """New PENDING tasks' rows (:data:`TASK_INSERT`), ordered from ``first``, at ``epoch``."""
    return [(run_id, s, first + i, TaskState.PENDING.value, epoch, t) for i, s in enumerate(steps)]


def event_of(event_id: int, values: tuple[Any, ...]) -> Event:
    """The record of an event inserted with ``values`` (:func:`event_values`)."""
    run_id, step, t, actor, kind, frm, to, reason, data = values
    return Event(id=int(event_id), run_id=run_id, step=step, time=t, actor=actor, kind=kind,
                 from_state=frm, to_state=to, reason=reason, data=json.loads(data))


def event_record(r: Any) -> Event:
    return Event(id=int(r["id"]), run_id=r["run_id"], step=r["step"], time=r["time"],
                 actor=r["actor"], kind=r["kind"], from_state=r["from_state"],
                 to_state=r["to_state"], reason=r["reason"], data=json.loads(r["data"]))


def run_record(r: Any) -> RunRecord:
    return RunRecord(
        run_id=r["run_id"], flow_name=r["flow_name"], flow_path=r["flow_path"],
        params=json.loads(r["params"]), fingerprint=json.loads(r["fingerprint"]),
        options=json.loads(r["options"]), state=RunState(r["state"]),
        created_at=r["created_at"], updated_at=r["updated_at"],
        controller_epoch=r["controller_epoch"], controller_pid=r["controller_pid"],
        controller_host=r["controller_host"], controller_lease_until=r["controller_lease_until"],
    )


def task_record(r: Any) -> TaskRecord:
    return TaskRecord(
        run_id=r["run_id"], step=r["step"], state=TaskState(r["state"]), epoch=r["epoch"],
        attempts=r["attempts"], failures=r["failures"], pid=r["pid"], host=r["host"],
        lease_until=r["lease_until"], progress_done=r["progress_done"],
        progress_total=r["progress_total"], output_ref=r["output_ref"], error=r["error"],
        next_attempt_at=r["next_attempt_at"], started_at=r["started_at"],
        finished_at=r["finished_at"], updated_at=r["updated_at"],
    )


def checkpoint_record(r: Any) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=r["run_id"], step=r["step"], seq=r["seq"], epoch=r["epoch"], path=r["path"],
        created_at=r["created_at"], position=json.loads(r["position"]), nbytes=r["nbytes"],
        status=r["status"],
    )
