"""The store's one core (segue.store.transitions): pure decisions, no database."""

from __future__ import annotations

import pytest

from segue._canon import canonical_json
from segue.errors import IllegalTransitionError
from segue.states import TASK_TRANSITIONS, Actor, TaskState
from segue.store import transitions as rules

T = TaskState
ROW = {"state": "RUNNING", "epoch": 7, "attempts": 3, "failures": 2, "started_at": None,
       "pid": 11, "host": "h", "lease_until": 9.0}


def test_a_task_move_resolves_against_the_row_it_was_judged_on() -> None:
    move = rules.task_move("r", "s", T.RETRYING, actor=Actor.CONTROLLER, reason="boom",
                           count_failure=True, error="x", next_attempt_at=50.0)
    assert move.sources == {s.value for s in T if T.RETRYING in TASK_TRANSITIONS[s]}
    assert rules.resolve_changes(move.changes, ROW, 100.0) == {
        "state": "RETRYING", "failures": 3, "next_attempt_at": 50.0, "finished_at": None,
        "updated_at": 100.0, "error": "x", "pid": None, "host": None, "lease_until": None}
    # Leaving a state other than RUNNING keeps the attempt's columns.
    assert "pid" not in rules.resolve_changes(move.changes, {**ROW, "state": "RETRYING"}, 1.0)
    args = rules.event_args(move.event, ROW, 100.0)
    assert (args["from_state"], args["to_state"], args["data"]) == (
        "RUNNING", "RETRYING", {"epoch": 7, "error": "x"})


def test_a_start_counts_the_attempt_and_leases_from_the_write_time() -> None:
    move = rules.start_move("s", ttl_s=30, actor=Actor.CONTROLLER, data={"gpus": [0]})
    got = rules.resolve_changes(move.changes, {**ROW, "state": "RETRYING"}, 100.0)
    assert (got["epoch"], got["attempts"], got["lease_until"], got["started_at"]) == (8, 4, 130.0, 100.0)
    args = rules.event_args(move.event, ROW, 100.0)
    assert args["reason"] == "attempt 4 started"
    assert args["data"] == {"epoch": 8, "attempt": 4, "gpus": [0]}
    with pytest.raises(IllegalTransitionError, match=r"SUCCEEDED"):
        move.check("SUCCEEDED")


def test_json_with_column_values_is_the_canonical_json_of_the_resolved_data() -> None:
    data = {"error": 'a "b" \u00fc', "epoch": rules.Old("epoch"), "attempt": rules.Old("attempts", 1),
            "x": [1, {"y": None}]}
    text = rules.json_text(data)
    assert isinstance(text, rules.Text)
    assert rules.resolve(text, ROW, 0.0) == canonical_json(
        {"error": 'a "b" \u00fc', "epoch": 7, "attempt": 4, "x": [1, {"y": None}]})
    assert rules.json_text({"a": 1}) == '{"a":1}'


def test_only_from_refuses_with_the_states_it_allows() -> None:
    move = rules.task_move("r", "s", T.FAILED, actor=Actor.CLI, reason="x", only_from={T.PARKED})
    assert move.sources == frozenset()  # PARKED -> FAILED is not in the table
    with pytest.raises(IllegalTransitionError, match=r"only allowed from PARKED"):
        move.check("RUNNING")
    with pytest.raises(ValueError, match=r"use start_attempt to move a task to RUNNING"):
        rules.task_move("r", "s", T.RUNNING, actor=Actor.CLI, reason="x")
