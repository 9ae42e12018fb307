"""A segue home on PostgreSQL: the store is selected by URL, and whole runs work on it.

The CLI cases run the real `segue` against a fresh database of the throwaway
server (tests/pgserver.py) and compare outputs with an SQLite run's; without
the server binaries or psycopg they skip and say why. The scheduling extras
(run statistics, waiting requests, placed starts) run on both backends.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _store_helpers import BACKENDS, make_run
from segue_helpers import FLOWS, Segue, wait_for

from segue._procs import pid_alive
from segue.errors import IllegalTransitionError, StoreError, UsageError
from segue.home import Home
from segue.placement.policy import Need
from segue.states import Actor, TaskState
from segue.store import SQLiteStore, Store, open_store, sqlite_only, store_url

COUNTER = str(FLOWS / "counter.py")
QUICK = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}


@pytest.fixture
def pg_url(new_target: Callable[[str], str]) -> str:
    """A fresh database (skips, saying why, without a server)."""
    return new_target("postgres")


@pytest.fixture
def pg_segue(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Segue:
    """The CLI on a home whose store is ``pg_url`` by $SEGUE_STORE (this process too,
    so that Segue.output and Home.open_store read the same database)."""
    monkeypatch.setenv("SEGUE_STORE", pg_url)
    return Segue(tmp_path / "home")


def _assert_counter_output(segue: Segue, run: str, ref: dict[str, Any], n: int) -> None:
    got = segue.output(run, "count")
    assert got["acc"] == ref["count"]["acc"] and got["i"] == n
    np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
    assert segue.output(run, "report") == ref["report"]


def _on_postgres_only(segue: Segue, url: str, run: str) -> None:
    """The run is in the database, and nothing of it in the home's SQLite file."""
    from segue.store.postgres import PostgresStore

    pg = PostgresStore(url)
    try:
        assert pg.get_run(run).run_id == run
    finally:
        pg.close()
    db = Home.resolve(segue.home).db_path
    if db.exists():
        assert SQLiteStore(db).list_runs() == []


# -- selection -------------------------------------------------------------------------------
def test_selection_env_then_config_then_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEGUE_STORE", raising=False)
    home = tmp_path / "h"
    home.mkdir()
    assert store_url(home) is None
    assert isinstance(open_store(home), SQLiteStore)
    (home / "config.json").write_text(json.dumps({"store": "postgresql://u@db1/segue"}))
    assert store_url(home) == "postgresql://u@db1/segue"
    monkeypatch.setenv("SEGUE_STORE", "postgres://u@db2/segue")
    assert store_url(home) == "postgres://u@db2/segue"  # the environment wins
    with pytest.raises(StoreError, match=r"^webhooks needs the SQLite metadata store; this home "
                                         r"uses postgres://u@db2/segue, where it is not supported yet$"):
        sqlite_only(home, "webhooks")


def test_open_store_takes_a_home_or_a_url_and_creates_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str) -> None:
    """One open_store for a home and for a URL; the scheduler opening another home's
    store (create=False) writes nothing where there is none."""
    from segue.scheduler.agent import _open_home_store
    from segue.store.postgres import PostgresStore

    monkeypatch.delenv("SEGUE_STORE", raising=False)
    by_url = open_store(pg_url)
    try:
        assert isinstance(by_url, PostgresStore) and by_url.url == pg_url
    finally:
        by_url.close()
    with pytest.raises(UsageError, match=r"^store: unsupported metadata store 'mysql://u:\*\*\*@db/x'"):
        open_store("mysql://u:pw@db/x")
    gone = tmp_path / "gone"
    with pytest.raises(StoreError, match=r"has no metadata store \(segue\.db\)$"):
        open_store(gone, create=False)
    assert _open_home_store(str(gone)) is None and not gone.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _open_home_store(str(empty)) is None and list(empty.iterdir()) == []
    make_run(open_store(tmp_path / "h"))  # creates the home and its file
    other = _open_home_store(str(tmp_path / "h"))
    assert isinstance(other, SQLiteStore) and [r.run_id for r in other.list_runs()] == ["r1"]
    other.close()
    pg_home = _open_home_store(str(empty), pg_url)  # an explicit store applies to every home
    try:
        assert isinstance(pg_home, PostgresStore) and pg_home.home == str(empty)
    finally:
        pg_home.close()


@pytest.mark.parametrize("where", ["env", "config"])
def test_unknown_scheme_is_one_line_and_hides_the_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    home = tmp_path / "h"
    home.mkdir()
    bad = "mysql://admin:s3cret@db/segue"
    if where == "env":
        monkeypatch.setenv("SEGUE_STORE", bad)
        prefix = r"\$SEGUE_STORE"
    else:
        monkeypatch.delenv("SEGUE_STORE", raising=False)
        (home / "config.json").write_text(json.dumps({"store": bad}))
        prefix = ".*config.json"
    with pytest.raises(UsageError) as e:
        open_store(home)
    msg = str(e.value)
    assert "\n" not in msg and "s3cret" not in msg
    assert re.fullmatch(prefix + r": unsupported metadata store 'mysql://admin:\*\*\*@db/segue'; "
                        r"use postgresql://USER@HOST\[:PORT\]/DB \(or postgres://\.\.\.\), "
                        r"or leave it unset for SQLite in HOME/segue.db", msg), msg


def test_cli_store_flag_rejects_unknown_scheme(tmp_path: Path) -> None:
    segue = Segue(tmp_path / "home")
    segue.env.pop("SEGUE_STORE", None)
    proc = segue("--store", "sqlite://x:pw@h/db", "ls")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "pw" not in proc.stderr
    assert proc.stderr.startswith("segue: --store: unsupported metadata store 'sqlite://x:***@h/db'")


# -- whole runs through the CLI --------------------------------------------------------------
def test_counter_run_on_postgres_matches_sqlite(pg_segue: Segue, pg_url: str, counter_ref: Any) -> None:
    run = "pg"
    proc = pg_segue("run", COUNTER, "--run-id", run, "-p", "n=150", "-p", "sleep=0")
    assert proc.returncode == 0, proc.stderr
    doc = pg_segue.status(run)
    assert doc["state"] == "SUCCEEDED"
    assert [s["state"] for s in doc["steps"]] == ["SUCCEEDED", "SUCCEEDED"]
    events = pg_segue.events(run)
    runs = [e["to_state"] for e in events if e["kind"] == "run"]
    assert runs[0] == "PENDING" and runs[-1] == "SUCCEEDED"
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    text = pg_segue("events", run)
    assert text.returncode == 0 and "SUCCEEDED" in text.stdout, text.stderr
    _assert_counter_output(pg_segue, run, counter_ref(150), 150)
    _on_postgres_only(pg_segue, pg_url, run)
    # The scheduler's run statistics (recorded after each attempt) went there too.
    assert Home.resolve(pg_segue.home).open_store().get_stats(run)
    # Another machine's home (a fresh directory, the same database) sees the run.
    other = Segue(pg_segue.home.parent / "other-host-home")
    assert other.status(run)["state"] == "SUCCEEDED"
    assert [r["run_id"] for r in other.json("ls")] == [run]


def test_cli_store_flag_and_config_select_postgres(pg_url: str, tmp_path: Path,
                                                   counter_ref: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEGUE_STORE", raising=False)
    segue = Segue(tmp_path / "home")
    run = "flag"
    proc = segue("--store", pg_url, "run", COUNTER, "--run-id", run, "-p", "n=60", "-p", "sleep=0")
    assert proc.returncode == 0, proc.stderr
    alone = segue("status", run)  # without the flag: the home's SQLite file, which lacks it
    assert alone.returncode == 2 and alone.stderr.startswith("segue: unknown run 'flag'")
    (segue.home / "config.json").write_text(json.dumps({"store": pg_url}))
    assert segue.status(run)["state"] == "SUCCEEDED"  # the config names the database
    _assert_counter_output(segue, run, counter_ref(60), 60)
    _on_postgres_only(segue, pg_url, run)


@pytest.mark.parametrize("fault", ["store.before_commit:kill:3", "checkpoint.published:kill:2",
                                   "worker.before_complete:kill"])
def test_worker_sigkill_is_retried_to_the_exact_output(pg_segue: Segue, counter_ref: Any,
                                                        fault: str) -> None:
    """The worker dies at a commit phase (store.before_commit: its Postgres write is cut
    off before COMMIT); its attempt is retried and the run ends bit-identical."""
    run = "kill"
    env = {"SEGUE_FAULTS": fault, "SEGUE_FAULTS_IN": "worker", "SEGUE_FAULTS_EPOCHS": "1", **QUICK}
    proc = pg_segue("run", COUNTER, "--run-id", run, "-p", "n=150", "-p", "sleep=0.002", env=env)
    assert proc.returncode == 0, proc.stderr
    count = pg_segue.status(run)["steps"][0]
    assert count["attempts"] == 2, count
    assert sigkills(pg_segue, run, "count") == 1  # the fault landed, once
    _assert_counter_output(pg_segue, run, counter_ref(150), 150)


def sigkills(segue: Segue, run: str, step: str) -> int:
    """SIGKILLs of workers the failure detector recorded (as in test_faults.py)."""
    return sum("killed by SIGKILL" in e["reason"] for e in segue.events(run)
               if e["actor"] == "failure-detector" and e["kind"] == "task" and e.get("step") == step)


def _held_run(segue: Segue, run: str, hold: Path) -> dict[str, Any]:
    """Start a detached counter run held at its last iteration; return its status once
    it has a checkpoint."""
    proc = segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=150", "-p", "sleep=0",
                 "-p", f"hold={hold}", env=QUICK)
    assert proc.returncode == 0, proc.stderr
    return wait_for(lambda: (d := segue.status(run))["steps"][0]["last_checkpoint"]
                    and d["steps"][0]["pid"] and d, 120, "a held attempt with a checkpoint")


def test_sigkill_of_worker_and_controller_then_resume(pg_segue: Segue, counter_ref: Any,
                                                      tmp_path: Path) -> None:
    run = "crash"
    hold = tmp_path / "hold"
    doc = _held_run(pg_segue, run, hold)
    ctl, worker = doc["controller"]["pid"], doc["steps"][0]["pid"]
    os.kill(ctl, signal.SIGKILL)  # the controller first: it must not retry the worker itself
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not pid_alive(ctl) and not pid_alive(worker), 30, "both to die")
    hold.touch()
    proc = pg_segue("resume", run, env=QUICK, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = pg_segue.status(run)
    assert doc["state"] == "SUCCEEDED" and doc["steps"][0]["attempts"] == 2
    assert any(e["reason"] == "controller lease stolen" for e in pg_segue.events(run))
    _assert_counter_output(pg_segue, run, counter_ref(150), 150)


def test_server_restarts_mid_run_lose_nothing_and_repeat_no_transition(
        pg_segue: Segue, counter_ref: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The database server crashes and restarts twice under a live run (controller and
    worker connected, committing): the run rides it out and ends bit-identical, and the
    event log shows every transition once."""
    server = request.getfixturevalue("pg_server")
    run = "restart"
    hold = tmp_path / "hold"
    _held_run(pg_segue, run, hold)
    store = Home.resolve(pg_segue.home).open_store()
    for _ in range(2):
        seq = store.list_checkpoints(run, "count")[0].seq
        server.restart()  # immediate: as a crash, every session cut off
        wait_for(lambda seq=seq: store.list_checkpoints(run, "count")[0].seq > seq, 120,
                 "a checkpoint committed after the restart")
    hold.touch()
    doc = pg_segue.wait_state(run, {"SUCCEEDED", "FAILED", "PAUSED"}, 300)
    assert doc["state"] == "SUCCEEDED", doc
    # Bit-identical: the store's reconnections drew no jitter from the step's global random
    # stream (they did, through psycopg_pool, before segue._rngshield).
    _assert_counter_output(pg_segue, run, counter_ref(150), 150)
    events = pg_segue.events(run)
    runs = [(e["from_state"], e["to_state"]) for e in events if e["kind"] == "run"]
    assert runs == [(None, "PENDING"), ("PENDING", "RUNNING"), ("RUNNING", "SUCCEEDED")], runs
    count = [(e["from_state"], e["to_state"], e["data"].get("epoch")) for e in events
             if e["kind"] == "task" and e.get("step") == "count"]
    assert len(count) == len(set(count)), count  # no transition applied twice
    seqs = [e["data"]["seq"] for e in events if e["kind"] == "checkpoint" and e.get("step") == "count"
            and e["reason"] == f"checkpoint {e['data'].get('seq')} committed"]
    assert len(seqs) == len(set(seqs)), seqs  # no checkpoint recorded twice
    store.close()


def test_pause_and_resume_through_the_cli(pg_segue: Segue, counter_ref: Any, tmp_path: Path) -> None:
    run = "pz"
    hold = tmp_path / "hold"
    _held_run(pg_segue, run, hold)
    proc = pg_segue("pause", run, "--wait", "--timeout", "120")
    assert proc.returncode == 0, proc.stderr
    doc = pg_segue.status(run)
    assert doc["state"] == "PAUSED" and doc["steps"][0]["state"] == "PARKED"
    hold.touch()
    proc = pg_segue("resume", run, env=QUICK, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert pg_segue.status(run)["state"] == "SUCCEEDED"
    kinds = [e["to_state"] for e in pg_segue.events(run) if e["kind"] == "run"]
    assert "PAUSING" in kinds and "PAUSED" in kinds and kinds[-1] == "SUCCEEDED"
    _assert_counter_output(pg_segue, run, counter_ref(150), 150)


# -- the extras, on both backends -------------------------------------------------------------
@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_stats_add_and_set(store: Any) -> None:
    assert store.get_stats("r1") == {}
    store.add_stats("r1", {"gpu_s": 1.5, "cost": 2})
    store.add_stats("r1", {"gpu_s": 0.25})
    store.add_stats("r1", {})
    assert store.get_stats("r1") == {"gpu_s": 1.75, "cost": 2.0}
    store.set_stats("r1", {"cost": 7, "wait_s": 3})
    assert store.get_stats("r1") == {"gpu_s": 1.75, "cost": 7.0, "wait_s": 3.0}
    assert store.get_stats("other") == {}


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_requests_upsert_list_drop(store: Any) -> None:
    need = Need(gpus=1, gpu_memory=None, cpus=2.0, memory=1 << 30)
    a = store.upsert_request("r1", "train", host="h1", need=need, priority=5, reason="no gpu",
                             ttl_s=600)
    b = store.upsert_request("r1", "train", host="h1", need=need, priority=7, reason="still",
                             ttl_s=600)
    assert b.submitted_at == a.submitted_at  # a live request keeps its place in the queue
    assert (b.priority, b.reason, b.need) == (7, "still", need)
    store.upsert_request("r1", "eval", host="h2", need=Need(cpus=1.0), priority=9, reason="cpu",
                         ttl_s=600)
    store.upsert_request("r2", "load", host="h1", need=Need(), priority=1, reason="gone", ttl_s=-1)
    assert [(r.run_id, r.step) for r in store.list_requests()] == [("r1", "eval"), ("r1", "train")]
    assert [r.step for r in store.list_requests("h1")] == ["train"]
    store.drop_request("r1", "eval")
    assert [r.step for r in store.list_requests()] == ["train"]
    store.drop_request("r1")
    assert store.list_requests() == []


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_start_placed_attempt(store: Store) -> None:
    s: Any = store
    make_run(store)
    s.upsert_request("r1", "load", host="h1", need=Need(gpus=1), priority=0, reason="w", ttl_s=600)
    task = s.start_placed_attempt("r1", "load", ttl_s=60, actor=Actor.SCHEDULER,
                                  data={"devices": [0], "host": "h1"})
    assert (task.state, task.epoch, task.attempts) == (TaskState.RUNNING, 1, 1)
    assert s.list_requests() == []  # placed: no longer waiting
    ev = store.list_events("r1", kinds=["task"])[-1]
    assert ev.reason == "attempt 1 started" and ev.actor == Actor.SCHEDULER
    assert ev.data == {"epoch": 1, "attempt": 1, "devices": [0], "host": "h1"}
    with pytest.raises(IllegalTransitionError):
        s.start_placed_attempt("r1", "load", ttl_s=60, actor=Actor.SCHEDULER, data={})
    assert store.get_task("r1", "load").epoch == 1

