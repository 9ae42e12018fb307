"""``SqlSink`` into a table that does not exist: created from the first batch, never retried in vain.

The bug this guards: a sink into a missing table failed every attempt with
"no such table: events" until the retries ran out. Now the sink creates the
table from the first batch's values (int, float, str, bytes, bool; anything
else as JSON text) in the transaction of its first publish; without columns
to create it from, the run is refused at submit; and a SQL error a retry
cannot fix (a constraint, a missing column) fails the step at once.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import Segue, wait_for

from segue.data import DataError, SqlSink
from segue.data.sinks.base import Scope

FLOW = str(Path(__file__).parent / "flows" / "sql_events.py")
FAST = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
ROWS = [("k", "INTEGER"), ("v", "TEXT"), ("score", "REAL"), ("blob", "BLOB"), ("ok", "INTEGER"),
        ("meta", "TEXT")]


def write_input(path: Path, n: int, **per_key: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for k in range(n):
            f.write(json.dumps({"k": k, **per_key.get(str(k), {})}) + "\n")
    return path


def run(segue: Segue, run_id: str, inp: Path, db: Path, *extra: str, check: bool = False) -> Any:
    return segue("run", FLOW, "--run-id", run_id, "-p", f"input={inp}", "-p", f"db={db}", *extra, check=check)


def test_a_missing_table_is_created_from_the_first_batch_and_survives_a_resume(tmp_path: Path) -> None:
    segue = Segue(tmp_path / "home")
    segue.env.update(FAST)
    db, gate = tmp_path / "out.db", tmp_path / "gate"
    # The first read batch is slow (a checkpoint is due at its end); record 700 waits on the gate.
    slow = {str(k): {"sleep": 0.001} for k in range(520)}
    inp = write_input(tmp_path / "in.jsonl", 1000, **slow, **{"700": {"hold": str(gate)}})
    run(segue, "ev", inp, db, "--detach", "--pause-deadline", "1", check=True)
    step = wait_for(lambda: (s := segue.step("ev", "enrich"))["last_checkpoint"] and s
                    or s["state"] == "FAILED" and s, 120, "the first checkpoint")
    assert step["last_checkpoint"], step["error"]
    assert segue("pause", "ev", "--wait", "--timeout", "60").returncode == 0
    with sqlite3.connect(db) as c:  # the first publish created the table, typed from its values
        assert [(r[1], r[2]) for r in c.execute("PRAGMA table_info(events)")] == ROWS
        first = c.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert 0 < first < 1000
    gate.write_text("")
    proc = segue("resume", "ev")  # a new attempt opens the table it created, and finishes
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT k, v, score, blob, ok, meta FROM events ORDER BY k").fetchall()
    assert [r[0] for r in rows] == list(range(1000))  # every record exactly once
    assert rows[3] == (3, "v3", 1.5, b"3", 0, json.dumps({"k": 3, "tags": ["a", "b"]}))
    assert segue.step("ev", "enrich")["attempts"] == 2  # the pause, not a retry


def test_without_columns_a_missing_table_is_refused_at_submit(segue: Segue, tmp_path: Path) -> None:
    inp = write_input(tmp_path / "in.jsonl", 10)
    proc = run(segue, "nocols", inp, tmp_path / "out.db", "-p", "columns=")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("segue: step 'enrich': table events does not exist and SqlSink was "
                                  "given no columns to create it with; "), proc.stderr
    assert segue.json("ls") == []  # nothing was created
    assert not (tmp_path / "out.db").exists()


def test_a_sql_error_no_retry_can_fix_fails_the_step_at_once(tmp_path: Path) -> None:
    segue = Segue(tmp_path / "home")
    segue.env.update(FAST)
    db = tmp_path / "out.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE events (k INTEGER, v TEXT NOT NULL, score REAL, blob BLOB, ok INTEGER, "
                  "meta TEXT)")
    inp = write_input(tmp_path / "in.jsonl", 50, **{"7": {"null": True}})
    proc = run(segue, "nn", inp, db)
    assert proc.returncode == 1, proc.stderr
    step = segue.step("nn", "enrich")
    assert step["attempts"] == 1, step  # retries=5, none used: the same rows would fail again
    assert "NOT NULL constraint failed: events.v" in step["error"], step["error"]
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0


def test_a_table_without_a_declared_column_is_refused_with_its_columns(tmp_path: Path) -> None:
    segue = Segue(tmp_path / "home")
    segue.env.update(FAST)
    db = tmp_path / "out.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE events (k INTEGER, v TEXT)")
    proc = run(segue, "cols", write_input(tmp_path / "in.jsonl", 5), db)
    assert proc.returncode == 1
    step = segue.step("cols", "enrich")
    assert step["attempts"] == 1, step
    assert "table events has no column score, blob, ok, meta (its columns: k, v)" in step["error"], step


def test_busy_is_transient_and_a_missing_table_is_not(tmp_path: Path) -> None:
    from segue.data._sql import transient

    path = tmp_path / "t.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("BEGIN IMMEDIATE")
    assert transient(busy.value)
    with pytest.raises(sqlite3.OperationalError) as missing:
        other.execute("SELECT * FROM nope")
    assert not transient(missing.value)
    holder.rollback()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_both_dialects_create_the_table_with_their_types(request: pytest.FixtureRequest, tmp_path: Path,
                                                        dialect: str) -> None:
    from segue.data._sql import Db

    url = request.getfixturevalue("pg_url") if dialect == "postgres" else f"sqlite:///{tmp_path / 'o.db'}"
    db = Db(url)
    for t in ("events", "segue_staged_events", "segue_sink_ledger", "segue_sink_owner"):
        db.execute(f"DROP TABLE IF EXISTS {t}")
    cols = [c for c, _ in ROWS]
    sink = SqlSink(url, "events", cols, mode="upsert", key=["k"])
    sink.open(Scope("r", "s", 1), None)
    sink.write([{"k": k, "v": f"v{k}", "score": k / 2, "blob": b"x", "ok": True, "meta": [k]} for k in range(3)],
               "s0")
    sink.stage()
    assert not db.table_exists("events")  # nothing visible before the checkpoint commits
    sink.publish()
    sink.close()
    types = dict(db.column_types("events"))
    want = ({"k": "BIGINT", "v": "TEXT", "score": "DOUBLE PRECISION", "blob": "BYTEA", "ok": "BOOLEAN",
             "meta": "TEXT"} if dialect == "postgres" else dict(ROWS))
    assert {c: t.upper() for c, t in types.items()} == want
    assert db.execute("SELECT k, meta FROM events ORDER BY k").fetchall() == [(0, "[0]"), (1, "[1]"), (2, "[2]")]
    # upsert needs a unique key to merge on: the created table has it as primary key
    again = SqlSink(url, "events", cols, mode="upsert", key=["k"])
    again.open(Scope("r2", "s", 1), None)
    again.write([{"k": 1, "v": "new", "score": 0.0, "blob": b"", "ok": False, "meta": {}}], "s0")
    again.stage()
    again.publish()
    again.close()
    assert db.execute("SELECT k, v FROM events ORDER BY k").fetchall() == [(0, "v0"), (1, "new"), (2, "v2")]
    db.close()
    with pytest.raises(DataError, match=r"^table nothere does not exist and SqlSink was given no columns"):
        SqlSink(url, "nothere", []).open(Scope("r", "s", 1), None)
