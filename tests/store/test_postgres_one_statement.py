"""The PostgreSQL store's writes of one statement each (segue.store.postgres_hot) beyond
the task moves and the leases of test_postgres_store.py: an attempt's process, progress,
an event, a new run. On a real server: each takes no transaction of its own, writes what
the locked path (and SQLite) writes, a zombie's write is still refused with FencedError,
and a lost answer is settled by the commit marker, never applied twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pgserver
import pytest
from _store_helpers import make_run, refusals

from segue.errors import FencedError, RunExistsError, StoreError, UnknownRunError
from segue.states import Actor, TaskState
from segue.store import SQLiteStore, Store
from segue.store import postgres_hot as hot
from segue.store import transitions as rules
from segue.store.postgres import PostgresStore

T = TaskState


@pytest.fixture
def store(pg: pgserver.PgServer, new_target: Callable[[str], str]) -> Iterator[PostgresStore]:
    s = PostgresStore(new_target("postgres"))
    yield s
    s.close()


def _count_transactions(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The BEGINs of the locked path's transactions from here on."""
    begins: list[str] = []
    real_once = store._once
    monkeypatch.setattr(store, "_once", lambda body, begin, finish: (
        begin and begins.append(begin), real_once(body, begin, finish))[1])
    return begins


def _writes(store: Store) -> list[Any]:
    make_run(store, steps=["load", "train"])
    e = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    store.set_attempt_pid("r1", "train", e, 4242, "host-a")
    store.report_progress("r1", "train", e, 10.0, 100.0)
    store.report_progress("r1", "train", e, 20, None)
    return [store.append_event("r1", "note", actor=Actor.API, reason="a note", data={"n": 1, "ü": [1.5]}),
            store.append_event("r1", "command", actor=Actor.CLI, reason="for a step", step="load"),
            store.get_task("r1", "train")]


def test_the_writes_take_one_statement_and_write_what_sqlite_writes(
    store: PostgresStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    begins = _count_transactions(store, monkeypatch)
    got = {}
    for side in (store, SQLiteStore(tmp_path / "segue.db")):
        out = _writes(side)
        ev1, ev2, task = out
        got[type(side).__name__] = (
            side.get_run("r1").state, [(t.step, t.state, t.epoch) for t in side.get_tasks("r1")],
            (task.pid, task.host, task.progress_done, task.progress_total),
            [(e.kind, e.step, e.actor, e.from_state, e.to_state, e.reason, e.data)
             for e in side.list_events("r1")],
            [(e.kind, e.step, e.reason, e.data) for e in (ev1, ev2)])
        events = side.list_events("r1")
        assert [ev1, ev2] == events[-2:]  # the records returned are the rows stored
        if side is store:
            assert begins == [], "a write opened a transaction"
            assert ev1.id < ev2.id and ev1.time <= ev2.time
            assert task.updated_at is not None and task.updated_at >= ev1.time - 60
    assert got["PostgresStore"] == got["SQLiteStore"]


def test_a_zombie_is_fenced_and_what_may_not_be_done_goes_to_the_locked_path(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(store, steps=["train"])
    old = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    store.transition_task("r1", "train", T.RETRYING, actor=Actor.CONTROLLER, reason="lost",
                          epoch=old, next_attempt_at=0.0)
    new = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    store.set_attempt_pid("r1", "train", new, 7, "h")
    before = store.get_task("r1", "train")
    begins = _count_transactions(store, monkeypatch)
    with pytest.raises(FencedError, match=f"attempt epoch {old} .* superseded by epoch {new}"):
        store.set_attempt_pid("r1", "train", old, 99, "zombie")
    with pytest.raises(FencedError, match="superseded"):
        store.report_progress("r1", "train", old, 5.0, 10.0)
    assert store.get_task("r1", "train") == before  # nothing of the zombie's landed
    assert [x.data for x in refusals(store)] == [{"epoch": old, "current": new}] * 2
    assert len(begins) >= 2  # the locked path judged (and recorded the refusals)
    # Not RUNNING any more: the pid is refused, progress (fenced by epoch only) is not.
    store.transition_task("r1", "train", T.PENDING, actor=Actor.CLI, reason="x", only_from={T.RUNNING})
    with pytest.raises(FencedError, match="no longer holds"):
        store.set_attempt_pid("r1", "train", new, 8, "h")
    store.report_progress("r1", "train", new, 3.0, None)
    assert store.get_task("r1", "train").progress_done == 3.0
    # Unknown runs and steps, a taken run id: the locked path's errors and messages.
    with pytest.raises(UnknownRunError):
        store.append_event("nope", "note", actor=Actor.API, reason="x")
    with pytest.raises(StoreError, match="has no step 'nope'"):
        store.append_event("r1", "note", actor=Actor.API, reason="x", step="nope")
    with pytest.raises(UnknownRunError):
        store.report_progress("nope", "train", 1, 1.0, None)
    n = len(store.list_events("r1"))
    with pytest.raises(RunExistsError):
        make_run(store, steps=["other"])
    assert [t.step for t in store.get_tasks("r1")] == ["train"] and len(store.list_events("r1")) == n


def test_a_lost_answer_is_settled_by_the_marker(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement committed and the connection died before its answer came back: the
    writer learns from its commit marker that it committed, and answers without writing
    again (the event it returns is the one stored, the run exists once)."""
    import psycopg

    real, armed = store._execute_one, [0]

    def execute(conn: Any, sql: str, params: dict[str, Any]) -> Any:
        if not armed[0]:
            return real(conn, sql, params)
        armed[0] -= 1
        real(conn, sql, params)
        conn.close()  # the server committed; the client never hears back
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store, "_execute_one", execute)
    armed[0] = 1
    run = make_run(store, steps=["train"])
    assert run == store.get_run("r1") and [e.reason for e in store.list_events("r1")] == ["run created"]
    armed[0] = 1
    ev = store.append_event("r1", "note", actor=Actor.API, reason="once", data={"k": 1})
    assert [e for e in store.list_events("r1") if e.reason == "once"] == [ev]
    e = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    armed[0] = 2
    store.set_attempt_pid("r1", "train", e, 11, "h")
    store.report_progress("r1", "train", e, 2.0, 4.0)
    task = store.get_task("r1", "train")
    assert (task.pid, task.host, task.progress_done, task.progress_total) == (11, "h", 2.0, 4.0)
    assert armed == [0]


def test_a_move_is_rendered_once_per_shape() -> None:
    """The text depends on the move's shape only; its plain values are bound. Values an
    event's data holds are part of the text (its JSON), typed: 1, 1.0 and True differ."""
    def move(at: float, err: str) -> rules.Move:
        return rules.task_move("r", "s", T.RETRYING, actor=Actor.CONTROLLER, reason=f"failed {at}",
                               count_failure=True, error=err, next_attempt_at=at)

    sql1, v1 = hot.task_move(move(1.0, "boom"), run_id="r", step="s", epoch=3)
    sql2, v2 = hot.task_move(move(2.5, "boom"), run_id="r", step="s", epoch=4)
    assert sql1 is sql2 and (v1["c_next_attempt_at"], v2["c_next_attempt_at"]) == (1.0, 2.5)
    assert (v1["reason"], v2["reason"], v1["epoch"], v2["epoch"]) == ("failed 1.0", "failed 2.5", 3, 4)
    other = hot.task_move(move(1.0, "other"), run_id="r", step="s", epoch=3)[1]  # its data's text
    assert {k: v for k, v in other.items() if k.startswith("data")} != {
        k: v for k, v in v1.items() if k.startswith("data")}
    texts = set()
    for value in (1, 1.0, True, "1", None, -0.0, 0.0):
        m = rules.start_move("s", ttl_s=30, actor=Actor.CONTROLLER, data={"x": value})
        sql, values = hot.task_move(m, run_id="r", step="s", epoch=None)
        rendered, bound = hot._render(m)  # uncached
        assert sql == rendered
        assert values == {**bound, "run_id": "r", "step": "s", "epoch": None, "actor": "controller"}
        texts.add(tuple(v for k, v in sorted(values.items()) if k.startswith("data")))
    assert len(texts) == 7
    # A value that is no scalar is rendered every time, and still right.
    m = rules.start_move("s", ttl_s=30, actor=Actor.CONTROLLER, data={"x": {"y": [1]}})
    assert hot.task_move(m, run_id="r", step="s", epoch=None)[0] == hot._render(m)[0]
