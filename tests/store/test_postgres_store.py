"""What the PostgreSQL store must get right beyond the shared contract: writers that
really run at once (READ COMMITTED), clocks that disagree, events committed late,
and a server that restarts under it.

Every interleaving is forced with handshakes, never with sleeps: a writer stops
itself at a fault point (SIGSTOP, seen with ``waitpid(WUNTRACED)``),
and a writer that must wait for a lock is seen waiting in ``pg_stat_activity``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pgserver
import pytest
from _store_helpers import make_run, refusals
from segue_helpers import VirtualClock, wait_for

from segue.errors import ControllerConflictError, FencedError, IllegalTransitionError, StoreError
from segue.states import Actor, RunState, TaskState
from segue.store import Store, TaskRecord
from segue.store.postgres import PostgresStore, is_postgres_url
from segue.store.postgres_schema import LATEST, MIGRATIONS, Migration, migrate, schema_version

WORKER = Path(__file__).with_name("_store_race_worker.py")
R, T = RunState, TaskState


@pytest.fixture
def target(pg: pgserver.PgServer, new_target: Callable[[str], str]) -> str:
    return new_target("postgres")


@pytest.fixture
def store(target: str) -> Iterator[PostgresStore]:
    s = PostgresStore(target)
    yield s
    s.close()


def _sql(url: str, query: str, *args: Any) -> Any:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, args).fetchone()  # type: ignore[arg-type]
        return None if row is None else row[0]


def _db_now(url: str) -> float:
    return float(_sql(url, "SELECT extract(epoch FROM clock_timestamp())::float8"))


def _await_lock_waiters(url: str, n: int = 1, timeout: float = 120) -> None:
    """Return once ``n`` sessions of the database wait for a lock (a handshake: the
    condition is polled, the test does not sleep in its place)."""
    deadline = time.monotonic() + timeout
    while _sql(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'") < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {n} session(s) came to wait for a lock within {timeout} s")
        time.sleep(0.01)


class Served:
    """A store in another process, answering one call per line (``serve`` mode)."""

    def __init__(self, target: str, log: Path, pause_at: str = "", **env: str) -> None:
        env = {**os.environ, **env, "PAUSE_AT": pause_at}
        self.log = log.open("w")
        self.p = subprocess.Popen([sys.executable, str(WORKER), "serve", target], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        assert self.p.stdout is not None and self.p.stdin is not None
        self.out, self.inp = self.p.stdout, self.p.stdin
        assert self.out.readline().strip() == "ready", log.read_text()

    def send(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.inp.write(json.dumps([method, args, kwargs]) + "\n")
        self.inp.flush()

    def reply(self) -> dict[str, Any]:
        line = self.out.readline()
        assert line, f"the served store died: {Path(self.log.name).read_text()}"
        return json.loads(line)

    def ok(self) -> Any:
        """The reply's value; fails with the error it carries instead."""
        rep = self.reply()
        assert "ok" in rep, rep
        return rep["ok"]

    def call(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.send(method, *args, **kwargs)
        return self.reply()

    def wait_stopped(self, timeout: float = 120) -> None:
        """Return once the process has stopped itself at its pause point."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.p.pid, os.WUNTRACED | os.WNOHANG)
            if pid:
                assert os.WIFSTOPPED(status), f"it exited: {Path(self.log.name).read_text()}"
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"it never reached its pause point within {timeout} s")
            time.sleep(0.01)

    def cont(self) -> None:
        os.kill(self.p.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.p.poll() is None:
            self.inp.close()
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.out.close()
        self.log.close()


@pytest.fixture
def served(target: str, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def new(pause_at: str = "", **env: str) -> Served:
        made.append(Served(target, tmp_path / f"served{len(made)}.log", pause_at, **env))
        return made[-1]

    yield new
    for s in made:
        if s.p.poll() is None:
            s.cont()  # a test that failed may leave one stopped
        s.close()


# -- opening --------------------------------------------------------------------------
def test_is_postgres_url() -> None:
    assert is_postgres_url("postgresql://u@h/db") and is_postgres_url("postgres://h/db")
    assert is_postgres_url("PostgreSQL://h/db")
    assert not is_postgres_url("/home/u/.segue/segue.db")
    assert not is_postgres_url(Path("postgresql://h/db")) and not is_postgres_url("sqlite:///x")


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(StoreError, match=r"^a PostgreSQL metadata store needs psycopg 3 and "
                       r"psycopg_pool \(psycopg_pool is missing\); pip install 'segue\[postgres\]'$"):
        PostgresStore("postgresql://segue@127.0.0.1/x")


def test_importing_the_store_package_does_not_import_psycopg() -> None:
    code = ("import sys, segue.store, segue.store.postgres; "
            "print(sorted(m for m in sys.modules if m.startswith('psycopg')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unreachable_server_is_a_store_error_without_the_password() -> None:
    with pytest.raises(StoreError, match=r"^cannot open metadata store "
                       r"postgresql://segue:\*\*\*@127\.0\.0\.1:1/nope: ") as info:
        PostgresStore("postgresql://segue:hunter2@127.0.0.1:1/nope")
    assert "hunter2" not in str(info.value)


# -- schema ---------------------------------------------------------------------------
def test_a_fresh_database_is_migrated_and_reopened(target: str) -> None:
    store = PostgresStore(target)
    make_run(store)
    store.close()
    assert _sql(target, "SELECT max(version) FROM segue_schema") == LATEST
    again = PostgresStore(target)
    assert [r.run_id for r in again.list_runs()] == ["r1"]
    again.close()


def test_a_database_from_a_newer_segue_is_refused(target: str) -> None:
    PostgresStore(target).close()
    _sql(target, "INSERT INTO segue_schema VALUES (%s, 'future', 0) RETURNING version", LATEST + 1)
    with pytest.raises(StoreError, match=rf"^metadata store postgresql://\S+ has schema version "
                       rf"{LATEST + 1}, newer than this segue supports \({LATEST}\); upgrade segue$"):
        PostgresStore(target)


def test_a_failing_migration_changes_nothing(target: str) -> None:
    import psycopg

    broken = (*MIGRATIONS, Migration(LATEST + 1, "breaks halfway",
                                     ("CREATE TABLE extra (x integer)", "THIS IS NOT SQL")))
    with psycopg.connect(target, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SyntaxError):
            migrate(conn, "t", broken)
        assert schema_version(conn) == 0
        assert conn.execute("SELECT to_regclass('runs')").fetchone() == (None,)
        assert migrate(conn, "t") == LATEST


# -- fencing between processes ----------------------------------------------------------
def test_a_fence_check_and_its_write_are_one_transaction(
    store: PostgresStore, target: str, served: Callable[..., Served]
) -> None:
    """A zombie stopped right after its epoch check still holds the task: the takeover
    waits for it, so the check cannot go stale before the write lands."""
    make_run(store)
    assert store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch == 1
    zombie = served("store.fence_checked")
    zombie.send("commit_checkpoint", "r1", "train", 1, seq=1, path="c/1", position=None, nbytes=1)
    zombie.wait_stopped()
    detector, took_over = PostgresStore(target), []

    def take_over() -> None:
        detector.transition_task("r1", "train", T.PENDING, actor=Actor.FAILURE_DETECTOR,
                                 reason="lease expired", only_from={T.RUNNING})
        took_over.append(detector.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER))

    thread = threading.Thread(target=take_over)
    thread.start()
    _await_lock_waiters(target)  # the takeover waits for the zombie's lock...
    zombie.cont()
    assert zombie.ok()["epoch"] == 1  # ...which commits what it checked
    thread.join()
    detector.close()
    assert took_over[0].epoch == 2
    log = [(e.kind, e.to_state, e.data.get("epoch")) for e in store.list_events("r1")]
    assert log[-3:] == [("checkpoint", None, 1), ("task", "PENDING", 1), ("task", "RUNNING", 2)]
    # From now on the zombie is refused, and the refusal is on record.
    assert zombie.call("commit_checkpoint", "r1", "train", 1, seq=2, path="c/2", position=None,
                       nbytes=1)["error"] == "FencedError"
    assert [e.data for e in refusals(store)] == [{"epoch": 1, "current": 2}]


def test_a_frozen_writer_does_not_hold_its_run_for_ever(
    store: PostgresStore, served: Callable[..., Served]
) -> None:
    """The server ends a session idle in its transaction; the takeover then goes
    ahead, and the writer, thawed, runs its write again and is fenced."""
    make_run(store)
    store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    zombie = served("store.fence_checked", IDLE_IN_TX_TIMEOUT_S="0.5")
    zombie.send("commit_checkpoint", "r1", "train", 1, seq=1, path="c/1", position=None, nbytes=1)
    zombie.wait_stopped()  # frozen, holding the run's and the task's locks
    # These wait for the locks until the server ends the frozen session (no sleep here).
    store.transition_task("r1", "train", T.PENDING, actor=Actor.FAILURE_DETECTOR,
                          reason="lease expired", only_from={T.RUNNING})
    assert store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch == 2
    zombie.cont()
    assert zombie.reply()["error"] == "FencedError"
    assert store.list_checkpoints("r1") == []
    assert [e.data for e in refusals(store)] == [{"epoch": 1, "current": 2}]


def test_racing_fenced_writes_after_an_epoch_bump(
    store: PostgresStore, served: Callable[..., Served]
) -> None:
    """Two zombies (epoch 1) and two holders of epoch 2 race to complete the task,
    released together: exactly one wins each round; every zombie write is refused."""
    rounds = 8
    for i in range(rounds):
        make_run(store, f"r{i}")
        store.start_attempt(f"r{i}", "train", ttl_s=60, actor=Actor.CONTROLLER)
        store.transition_task(f"r{i}", "train", T.PENDING, actor=Actor.FAILURE_DETECTOR,
                              reason="lease expired")
        assert store.start_attempt(f"r{i}", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch == 2
    racers = [(served(), 1), (served(), 1), (served(), 2), (served(), 2)]
    outcomes: dict[str, int] = {}
    for i in range(rounds):
        for racer, epoch in racers:  # every racer is idle on its stdin: the lines go out together
            racer.send("complete_task", f"r{i}", "train", epoch, output_ref=f"out-{epoch}",
                       actor=Actor.WORKER)
        replies = [(epoch, racer.reply()) for racer, epoch in racers]
        for epoch, rep in replies:
            key = f"{epoch}:{rep.get('error', 'won')}"
            outcomes[key] = outcomes.get(key, 0) + 1
        task = store.get_task(f"r{i}", "train")
        assert (task.state, task.output_ref, task.epoch) == (T.SUCCEEDED, "out-2", 2)
        wins = [e for e in store.list_events(f"r{i}") if e.to_state == "SUCCEEDED"]
        assert len(wins) == 1
        assert [e.data for e in refusals(store, f"r{i}")] == [{"epoch": 1, "current": 2}] * 2
    assert outcomes == {"2:won": rounds, "2:IllegalTransitionError": rounds,
                        "1:FencedError": 2 * rounds}


# -- the database's clock -----------------------------------------------------------------
@pytest.mark.parametrize("skew", [300.0, -300.0])
def test_leases_follow_the_database_clock_not_the_clients(
    store: PostgresStore, target: str, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    make_run(store, "live")
    make_run(store, "dead")
    store.acquire_controller("live", pid=1, host="a", ttl_s=60)
    store.acquire_controller("dead", pid=1, host="a", ttl_s=-1)  # expired when it was taken
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    # A client clock 300 s ahead must not take a live lease...
    with pytest.raises(ControllerConflictError):
        store.acquire_controller("live", pid=2, host="b", ttl_s=60)
    # ...and one 300 s behind must not keep a dead one alive.
    before = _db_now(target)
    assert store.acquire_controller("dead", pid=2, host="b", ttl_s=60) == 2
    task = store.start_attempt("dead", "train", ttl_s=30, actor=Actor.CONTROLLER)
    after = _db_now(target)
    # The leases it writes are the database's time plus the ttl, whatever the client's says.
    lease = store.get_run("dead").controller_lease_until
    assert lease is not None and before + 60 <= lease <= after + 60
    assert task.lease_until is not None and before + 30 <= task.lease_until <= after + 30


def test_the_clock_offset_moves_leases_for_tests(target: str) -> None:
    offset = [0.0]
    store = PostgresStore(target, clock_offset=lambda: offset[0])
    make_run(store)
    store.acquire_controller("r1", pid=1, host="h", ttl_s=10)
    offset[0] = 10.5  # virtual time: the lease is over without anyone sleeping
    before = _db_now(target)
    assert store.acquire_controller("r1", pid=2, host="h2", ttl_s=10) == 2
    after = _db_now(target)
    lease = store.get_run("r1").controller_lease_until
    assert lease is not None and before + 20.5 <= lease <= after + 20.5
    store.close()


def test_the_clock_file_moves_time_for_every_process(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = VirtualClock(tmp_path / "clock")
    monkeypatch.setenv("SEGUE_CLOCK_FILE", str(clock.path))
    clock.advance(3600)
    store = PostgresStore(target)
    make_run(store)
    store.acquire_controller("r1", pid=1, host="h", ttl_s=60)
    lease = store.get_run("r1").controller_lease_until
    assert lease is not None and lease > _db_now(target) + 3600
    store.close()


# -- events ---------------------------------------------------------------------------------
def test_paging_by_id_never_skips_an_event_committed_late(
    store: PostgresStore, target: str, served: Callable[..., Served]
) -> None:
    make_run(store, "r1")
    make_run(store, "r2")
    cursor = store.list_events("r1")[-1].id
    late = served("store.before_commit")  # a write of several statements (append_event is one)
    late.send("set_run_options", "r1", {"late": True}, actor=Actor.API, reason="late")
    late.wait_stopped()  # its event is inserted and its id drawn; COMMIT is not sent
    # A writer of another run is not held up: it draws a larger id and commits first.
    other = store.append_event("r2", "note", actor=Actor.API, reason="other run")
    # A writer of the same run waits for the run's lock, so it cannot overtake.
    second, appended = PostgresStore(target), []
    thread = threading.Thread(target=lambda: appended.append(
        second.append_event("r1", "note", actor=Actor.API, reason="second")))
    thread.start()
    _await_lock_waiters(target)
    assert store.list_events("r1", after_id=cursor) == []  # nothing is committed yet
    late.cont()
    late.ok()
    thread.join()
    second.close()
    page = store.list_events("r1", after_id=cursor)
    late_id = page[0].id
    assert [(e.reason, e.id) for e in page] == [("late", late_id), ("second", appended[0].id)]
    assert late_id < other.id < appended[0].id  # across runs, id order is not commit order


# -- a server that goes away ---------------------------------------------------------------
def _transitions(store: PostgresStore, run_id: str = "r1") -> list[tuple[str, str | None, str | None]]:
    return [(e.kind, e.from_state, e.to_state) for e in store.list_events(run_id)
            if e.kind in ("run", "task")]


def test_a_server_restart_mid_sequence(store: PostgresStore, pg: pgserver.PgServer) -> None:
    make_run(store, steps=["train"])
    ce = store.acquire_controller("r1", pid=1, host="h", ttl_s=60)
    store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="go", controller_epoch=ce)
    e = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    pg.restart()  # a crash: every pooled connection is dead
    assert store.heartbeat("r1", "train", e, ttl_s=60).run_state is R.RUNNING
    store.commit_checkpoint("r1", "train", e, seq=1, path="c/1", position=None, nbytes=1)
    pg.restart()
    store.complete_task("r1", "train", e, output_ref="out", actor=Actor.WORKER)
    store.renew_controller("r1", ce, ttl_s=60)
    store.transition_run("r1", R.SUCCEEDED, actor=Actor.CONTROLLER, reason="done", controller_epoch=ce)
    assert _transitions(store) == [
        ("run", None, "PENDING"), ("run", "PENDING", "RUNNING"), ("task", "PENDING", "RUNNING"),
        ("task", "RUNNING", "SUCCEEDED"), ("run", "RUNNING", "SUCCEEDED"),
    ]
    assert [c.seq for c in store.list_checkpoints("r1")] == [1]


def test_reconnections_leave_the_global_random_stream_alone(store: PostgresStore,
                                                           pg: pgserver.PgServer) -> None:
    """psycopg_pool draws jitter for every connection it opens; a step's random stream
    must not move when the store reconnects (segue._rngshield gives the pool its own)."""
    import random

    make_run(store)
    random.seed(5)
    before = random.getstate()
    pg.restart()  # every pooled connection is dead: the next calls open new ones
    make_run(store, "r2")
    store.close()  # and a new pool
    assert store.get_run("r2").run_id == "r2"
    assert random.getstate() == before


def test_a_write_cut_off_by_a_crash_before_commit_is_applied_once(
    store: PostgresStore, pg: pgserver.PgServer, served: Callable[..., Served]
) -> None:
    make_run(store)
    writer = served("store.before_commit")
    writer.send("start_attempt", "r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    writer.wait_stopped()  # the transaction is written, not committed
    pg.restart()  # the server crashes under it
    writer.cont()  # its COMMIT fails; the probe finds no marker; it runs again
    assert writer.ok()["epoch"] == 1
    assert store.get_task("r1", "train").epoch == 1
    assert _transitions(store).count(("task", "PENDING", "RUNNING")) == 1


def _lose_commit(store: PostgresStore, monkeypatch: pytest.MonkeyPatch, before: Callable[[Any], None],
                 after: Callable[[Any], None]) -> None:
    """The next COMMIT of ``store`` runs ``before``, is sent, then runs ``after``."""
    real = store._finish
    armed = [True]

    def finish(conn: Any, sql: str) -> None:
        if sql != "COMMIT" or not armed[0]:
            return real(conn, sql)
        armed[0] = False
        before(conn)
        real(conn, sql)
        after(conn)

    monkeypatch.setattr(store, "_finish", finish)


def test_a_commit_whose_answer_was_lost_is_not_applied_twice(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    make_run(store)

    def lose_answer(conn: Any) -> None:  # it committed, but the client never heard back
        conn.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    _lose_commit(store, monkeypatch, lambda conn: None, lose_answer)
    rec = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    assert rec.epoch == 1 and store.get_task("r1", "train") == rec
    assert _transitions(store).count(("task", "PENDING", "RUNNING")) == 1


def test_a_commit_cut_off_before_the_server_got_it_is_retried(
    store: PostgresStore, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(store)

    def terminate(conn: Any) -> None:  # the session ends (and rolls back) before COMMIT arrives
        assert _sql(target, "SELECT pg_terminate_backend(%s, 60000)", conn.info.backend_pid)

    _lose_commit(store, monkeypatch, terminate, lambda conn: None)
    rec = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    assert rec.epoch == 1 and store.get_task("r1", "train") == rec
    assert _transitions(store).count(("task", "PENDING", "RUNNING")) == 1


# -- the hot writes: one statement each (segue.store.postgres_hot) ----------------------------
def _hot_writes(store: PostgresStore) -> tuple[int, int]:
    """A run RUNNING under controller epoch ce, its task RUNNING under attempt epoch e."""
    make_run(store, steps=["train"])
    ce = store.acquire_controller("r1", pid=1, host="h", ttl_s=60)
    store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="go", controller_epoch=ce)
    return ce, store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch


def test_hot_writes_take_one_statement_and_judge_like_the_locked_path(
    store: PostgresStore, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ce, e = _hot_writes(store)
    transactions: list[str] = []
    real_once = store._once
    monkeypatch.setattr(store, "_once", lambda body, begin, finish: (
        begin and transactions.append(begin), real_once(body, begin, finish))[1])  # writes
    before = _db_now(target)
    hb = store.heartbeat("r1", "train", e, ttl_s=600)
    assert hb.run_state is R.RUNNING and hb.lease_until >= before + 600
    assert store.get_task("r1", "train").lease_until == hb.lease_until
    renewed = store.renew_controller("r1", ce, ttl_s=600)
    assert renewed.controller_lease_until is not None and renewed.controller_lease_until >= before + 600
    moved = store.transition_run("r1", R.PAUSING, actor=Actor.CLI, reason="pause",
                                 controller_epoch=ce)
    assert moved.state is R.PAUSING and store.get_run("r1") == moved
    assert transactions == [], "the common case opened a transaction"
    ev = store.list_events("r1")[-1]
    assert (ev.kind, ev.actor, ev.from_state, ev.to_state, ev.reason, ev.data) == (
        "run", Actor.CLI, "RUNNING", "PAUSING", "pause", {})
    # Whatever the one statement may not do goes to the locked path, which answers as ever.
    assert store.transition_run("r1", R.PAUSING, actor=Actor.CLI, reason="again") == moved
    with pytest.raises(IllegalTransitionError, match="PAUSING"):
        store.transition_run("r1", R.PENDING, actor=Actor.CLI, reason="back")
    with pytest.raises(IllegalTransitionError):
        store.transition_run("r1", R.PAUSED, actor=Actor.CLI, reason="only", only_from={R.RUNNING})
    with pytest.raises(FencedError):
        store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="old",
                             controller_epoch=ce + 1)
    with pytest.raises(FencedError):
        store.renew_controller("r1", ce + 1, ttl_s=60)
    with pytest.raises(FencedError):
        store.heartbeat("r1", "train", e + 1, ttl_s=60)
    assert len(transactions) >= 6 and store.get_run("r1") == moved
    assert [x.data for x in refusals(store)] == [
        {"epoch": ce + 1, "current": ce}, {"epoch": ce + 1, "current": ce},
        {"epoch": e + 1, "current": e}]


def _task_moves(store: Store) -> list[TaskRecord]:
    """Every kind of task move, each from a state it is legal from."""
    a = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    store.set_attempt_pid("r1", "train", a.epoch, 4242, "h")
    return [a, store.transition_task("r1", "train", T.RETRYING, actor=Actor.CONTROLLER,
                                     reason="it failed", epoch=a.epoch, count_failure=True,
                                     error='boom: "quoted" \u00fc', next_attempt_at=1234.5),
            store.start_attempt("r1", "train", ttl_s=30, actor=Actor.CONTROLLER),
            store.transition_task("r1", "train", T.PENDING, actor=Actor.FAILURE_DETECTOR,
                                  reason="lease expired", only_from={T.RUNNING}),
            c := store.start_attempt("r1", "train", ttl_s=30, actor=Actor.CONTROLLER),
            store.transition_task("r1", "train", T.PARKED, actor=Actor.CONTROLLER, reason="pause",
                                  epoch=c.epoch, reset_failures=True),
            store.transition_task("r1", "train", T.PENDING, actor=Actor.CLI, reason="resume"),
            d := store.start_attempt("r1", "train", ttl_s=30, actor=Actor.CONTROLLER),
            store.complete_task("r1", "train", d.epoch, output_ref="out/1", actor=Actor.WORKER)]


def test_task_moves_take_one_statement_and_write_what_sqlite_writes(
    store: PostgresStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transition_task, start_attempt and complete_task in one statement each, with the
    same rows and events as the locked path gives on SQLite (one core decides both)."""
    from segue.store import SQLiteStore

    lite = SQLiteStore(tmp_path / "segue.db")
    transactions: list[str] = []
    real_once = store._once
    monkeypatch.setattr(store, "_once", lambda body, begin, finish: (
        begin and transactions.append(begin), real_once(body, begin, finish))[1])  # writes
    times = ("started_at", "finished_at", "updated_at", "lease_until")
    got: dict[str, Any] = {}
    for side in (store, lite):
        make_run(side, steps=["train"])
        transactions.clear()
        records = _task_moves(side)
        if side is store:
            assert transactions == []  # set_attempt_pid is one statement too
        assert len(records) == 9 and records[-1].state is T.SUCCEEDED
        got[type(side).__name__] = (
            [{k: v for k, v in vars(r).items() if k not in times} for r in records],
            [(r.lease_until is None, r.finished_at is None, r.started_at == records[0].started_at,
              None if r.lease_until is None else round(r.lease_until - r.updated_at, 3))
             for r in records],
            [(e.kind, e.actor, e.from_state, e.to_state, e.reason, e.data)
             for e in side.list_events("r1")])
    lite.close()
    assert got["PostgresStore"] == got["SQLiteStore"]
    events = got["PostgresStore"][2]
    assert events[2] == ("task", Actor.CONTROLLER, "RUNNING", "RETRYING", "it failed",
                         {"epoch": 1, "error": 'boom: "quoted" \u00fc'})
    assert events[3][4] == "attempt 2 started" and events[3][5] == {"epoch": 2, "attempt": 2}
    assert store.list_events("r1")[-1].time == store.get_task("r1", "train").finished_at
    # What one statement may not do goes to the locked path, which refuses as ever.
    with pytest.raises(IllegalTransitionError, match="SUCCEEDED"):
        store.transition_task("r1", "train", T.PENDING, actor=Actor.CLI, reason="again")
    with pytest.raises(IllegalTransitionError, match="SUCCEEDED"):
        store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    make_run(store, "r2", steps=["train"])
    e = store.start_attempt("r2", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    with pytest.raises(FencedError):
        store.transition_task("r2", "train", T.RETRYING, actor=Actor.CONTROLLER, reason="old",
                              epoch=e - 1)
    with pytest.raises(FencedError):
        store.complete_task("r2", "train", e + 1, output_ref=None, actor=Actor.WORKER)
    with pytest.raises(IllegalTransitionError, match="only allowed from PARKED"):
        store.transition_task("r2", "train", T.FAILED, actor=Actor.CLI, reason="x",
                              only_from={T.PARKED})
    assert store.get_task("r2", "train").state is T.RUNNING
    assert [x.data for x in refusals(store, "r2")] == [{"epoch": e - 1, "current": e},
                                                        {"epoch": e + 1, "current": e}]


def _lose_answer(store: PostgresStore, monkeypatch: pytest.MonkeyPatch,
                 cut: Callable[[Any], None], *, send: bool) -> list[bool]:
    """The next one-statement write of ``store`` loses its connection: after the
    statement committed (``send``: ``cut`` closes the client's end), or before it was
    sent (``cut`` ends the session, so sending it fails)."""
    import psycopg

    real, armed = store._execute_one, [True]

    def execute(conn: Any, sql: str, params: dict[str, Any]) -> Any:
        if not armed[0]:
            return real(conn, sql, params)
        armed[0] = False
        if not send:
            cut(conn)
            return real(conn, sql, params)  # fails: the session is gone
        real(conn, sql, params)
        cut(conn)
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store, "_execute_one", execute)
    return armed  # [False] once the cut landed


@pytest.mark.parametrize("send", [True, False], ids=["answer-lost", "never-arrived"])
def test_a_hot_write_cut_off_is_applied_exactly_once(
    store: PostgresStore, target: str, monkeypatch: pytest.MonkeyPatch, send: bool
) -> None:
    """The statement committed but its answer was lost (its commit marker says so), or
    the session died before it arrived (no marker: the locked path runs it)."""
    ce, e = _hot_writes(store)

    def cut(conn: Any) -> None:
        if send:
            conn.close()  # the server committed; the client never hears back
        else:
            assert _sql(target, "SELECT pg_terminate_backend(%s, 60000)", conn.info.backend_pid)

    landed = _lose_answer(store, monkeypatch, cut, send=send)
    assert store.transition_run("r1", R.PAUSING, actor=Actor.CLI, reason="p").state is R.PAUSING
    assert _transitions(store).count(("run", "RUNNING", "PAUSING")) == 1 and landed == [False]
    landed = _lose_answer(store, monkeypatch, cut, send=send)
    hb = store.heartbeat("r1", "train", e, ttl_s=900)
    assert hb.run_state is R.PAUSING and hb.lease_until == store.get_task("r1", "train").lease_until
    assert landed == [False]
    landed = _lose_answer(store, monkeypatch, cut, send=send)
    assert store.renew_controller("r1", ce, ttl_s=900).controller_epoch == ce and landed == [False]
    assert refusals(store) == []


def test_waiters_wake_on_a_committed_event_and_poll_when_notifications_are_lost(
        store: PostgresStore, target: str, pg: pgserver.PgServer) -> None:
    """LISTEN/NOTIFY shortens a waiter's sleep; a lost listener (a server restart, a
    terminated session) only makes it poll, and the next wait listens again."""
    waiter = PostgresStore(target)
    try:
        assert waiter.wait_for_change(0.0) is False  # listening from now on
        woke: list[bool] = []
        t = threading.Thread(target=lambda: woke.append(waiter.wait_for_change(120.0)))
        t.start()
        make_run(store)  # its creation event commits: the waiter wakes, long before 120 s
        t.join(timeout=120)
        assert woke == [True] and waiter._listener.woken >= 1
        # A write that rolls back notifies nobody: the first acquire's event arrives
        # (waited for, however late), and nothing after it.
        with pytest.raises(ControllerConflictError):
            store.acquire_controller("r1", pid=1, host="h", ttl_s=60)
            store.acquire_controller("r1", pid=2, host="h", ttl_s=60)
        assert waiter.wait_for_change(120.0) is True
        assert waiter.wait_for_change(0.2) is False
        # The listener's session dies: the wait sleeps instead of failing, and counts it
        # (waits until the server's goodbye has reached the socket, however late).
        assert _sql(target, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                            " WHERE application_name = 'segue-listen'") == 1
        wait_for(lambda: waiter.wait_for_change(0.1) is False and waiter._listener.failures == 1,
                 60, "the lost listener to be noticed")
        assert waiter.wait_for_change(0.0) is False  # connected again
        make_run(store, "r2")
        assert waiter.wait_for_change(120.0) is True
        pg.restart()  # the same across a server restart
        wait_for(lambda: waiter.wait_for_change(0.1) is False and waiter._listener.failures == 2,
                 60, "the restart to be noticed")
        make_run(store, "r3")  # (the store's own pool reconnects by its retry rules)
        waiter.wait_for_change(0.0)  # listening again; r3's event may have come before
        make_run(store, "r4")
        assert waiter.wait_for_change(120.0) is True
    finally:
        waiter.close()
