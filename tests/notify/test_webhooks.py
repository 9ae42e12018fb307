"""Webhooks end to end: real runs, a real HTTP receiver on 127.0.0.1, the real store.

The receiver fails its first requests with 500 and records every request, so
the tests see the retries, the signatures and the delivery ids exactly as a
receiver would.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import io
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue.cli.webhook import add_parsers, cmd_webhook
from segue.client.local import LocalClient
from segue.errors import UsageError
from segue.home import Home
from segue.notify import HooksFile, Pump, verify
from segue.states import Actor, RunState
from segue.store import NewRun
from segue.store.migrations import MIGRATIONS, migrate, schema_version
from segue.store.outbox import SQLiteOutbox

COUNTER = str(FLOWS / "counter.py")
GPUJOB = str(FLOWS / "gpujob.py")


# -- a receiver -------------------------------------------------------------------------
@dataclass
class Request:
    path: str
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def doc(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers 500 to its first ``fail_first`` requests (and to all while ``refusing``)."""

    fail_first: int = 0
    refusing: bool = False
    answer: int = 200
    delay_s: float = 0.0
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def accepted(self, path: str | None = None) -> list[Request]:
        return [r for r in self.all(path) if r.status == 200]

    def all(self, path: str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if path is None or r.path == path]


@contextlib.contextmanager
def receiver(**kw: Any) -> Iterator[Receiver]:
    rec = Receiver(**kw)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if rec.delay_s:
                time.sleep(rec.delay_s)
            with rec.lock:
                served = len(rec.requests)
                status = 500 if rec.refusing or served < rec.fail_first else rec.answer
                rec.requests.append(Request(self.path, status, dict(self.headers), body))
            self.send_response(status)
            if status in (301, 302, 307, 308):
                self.send_header("Location", f"{rec.url}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{srv.server_port}"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


# -- helpers ----------------------------------------------------------------------------
def webhook(home: Path, *args: str) -> tuple[int, str]:
    """`segue webhook ...` in this process (the CLI module itself; main.py wires it)."""
    p = argparse.ArgumentParser(prog="segue")
    add_parsers(p.add_subparsers(dest="cmd", required=True))
    a = p.parse_args(["webhook", *args])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cmd_webhook(a, LocalClient(home, actor=Actor.CLI))
    return code, out.getvalue()


def add_hook(home: Path, url: str, events: str, secret_file: Path, *extra: str) -> str:
    code, out = webhook(home, "add", url, "--events", events, "--secret-file", str(secret_file), *extra)
    assert code == 0
    return out.split()[0]


def signature_ok(secret: str, r: Request) -> bool:
    """The receiver's check, written out independently of segue.notify.signing."""
    ts = r.headers["X-Segue-Timestamp"]
    mac = hmac.new(secret.encode(), ts.encode() + b"." + r.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(f"sha256={mac}", r.headers["X-Segue-Signature"]) and \
        abs(time.time() - int(ts)) < 300


def transition_id(client: LocalClient, run: str, to_state: str, actor: str | None = None) -> int:
    return next(e.id for e in client.events(run) if e.kind == "run" and e.to_state == to_state
                and (actor is None or e.actor == actor))


@pytest.fixture
def secret_file(tmp_path: Path) -> tuple[str, Path]:
    secret = "s3cret-" + "x" * 24
    f = tmp_path / "secret"
    f.write_text(secret + "\n")
    return secret, f


# -- end to end -------------------------------------------------------------------------
def test_chosen_events_arrive_signed_retried_with_stable_ids(
        segue: Segue, tmp_path: Path, secret_file: tuple[str, Path]) -> None:
    secret, sfile = secret_file
    with receiver(fail_first=2) as rec:
        hook = add_hook(segue.home, f"{rec.url}/a", "succeeded,paused", sfile, "--backoff", "0.1")
        other = add_hook(segue.home, f"{rec.url}/b", "failed,preempted", sfile)
        # a run that succeeds (the foreground CLI: its controller delivers as it ends) ...
        segue("run", COUNTER, "--run-id", "ok", "-p", "n=20", "-p", "sleep=0", check=True)
        # ... and one that is paused (a detached controller)
        gate = tmp_path / "gate"
        segue("run", COUNTER, "--detach", "--run-id", "held", "-p", "n=20", "-p", "sleep=0",
              "-p", f"hold={gate}", check=True)
        client = LocalClient(segue.home)
        wait_for(lambda: client.checkpoints("held"), 30, "the held run to checkpoint", poll=0.1)
        assert segue("pause", "held", "--wait", "--timeout", "30").returncode == 0
        wait_for(lambda: len(rec.accepted()) >= 2, 20, "both notifications", poll=0.05)
        time.sleep(0.5)  # anything extra would arrive now

    reqs = rec.all()
    assert rec.all("/b") == []  # the other hook wanted neither
    # exactly the chosen transitions, each accepted once
    got = sorted((r.headers["X-Segue-Event"], r.doc["run_id"]) for r in rec.accepted())
    assert got == [("paused", "held"), ("succeeded", "ok")]
    # the first two requests were refused with 500 and retried
    assert [r.status for r in reqs].count(500) == 2 and len(reqs) == 4
    # every request is signed with the secret over timestamp + body
    assert all(signature_ok(secret, r) for r in reqs)
    assert all(verify(secret, r.headers["X-Segue-Timestamp"], r.body, r.headers["X-Segue-Signature"])
               for r in reqs)
    assert not verify("another secret 1234", reqs[0].headers["X-Segue-Timestamp"], reqs[0].body,
                      reqs[0].headers["X-Segue-Signature"])
    assert not verify(secret, reqs[0].headers["X-Segue-Timestamp"], reqs[0].body,  # a replay, later
                      reqs[0].headers["X-Segue-Signature"], now=time.time() + 3600)
    # the delivery id is the transition's event id: the same on every attempt, so a
    # receiver recognises a retry (or a duplicate) of what it already has
    ids = {"succeeded": transition_id(client, "ok", "SUCCEEDED"),
           "paused": transition_id(client, "held", "PAUSED")}
    for r in reqs:
        assert r.headers["X-Segue-Delivery"] == r.doc["delivery"] == str(ids[r.doc["event"]])
        assert r.headers["X-Segue-Hook"] == hook and r.path == "/a"
    retried = [r for r in reqs if r.headers["X-Segue-Delivery"] == str(ids["succeeded"])]
    assert [r.headers["X-Segue-Attempt"] for r in retried] == ["1", "2", "3"]
    assert len({r.body for r in retried}) == 1  # the same bytes each time
    code, out = webhook(segue.home, "ls", "--json")
    by_id = {h["id"]: h for h in json.loads(out)}
    assert by_id[hook]["deliveries"]["delivered"] == 2 and "secret" not in by_id[hook]
    assert sum(by_id[other]["deliveries"].values()) == 0


def test_preempted_run_notifies(segue: Segue, tmp_path: Path, secret_file: tuple[str, Path]) -> None:
    _, sfile = secret_file
    assert segue("pool", "set", "--gpus", "1", "--gpu-mem", "80GB", "--cpus", "8").returncode == 0
    with receiver() as rec:
        add_hook(segue.home, rec.url, "preempted", sfile, "--backoff", "0.1")
        gates = {n: tmp_path / f"gate-{n}" for n in ("low", "hi")}
        segue("run", GPUJOB, "--detach", "--run-id", "low", "--priority", "batch", "-p", "n=400",
              "-p", f"gate={gates['low']}", check=True)
        client = LocalClient(segue.home)
        wait_for(lambda: client.checkpoints("low"), 60, "the batch run to checkpoint", poll=0.1)
        segue("run", GPUJOB, "--detach", "--run-id", "hi", "--priority", "urgent", "-p", "n=20",
              "-p", f"gate={gates['hi']}", check=True)
        # the victim's controller stays alive, PAUSED, waiting for capacity: it delivers
        wait_for(lambda: rec.accepted(), 60, "the preempted notification", poll=0.05)
        time.sleep(0.3)  # anything extra would arrive now
    [r] = rec.all()
    assert r.doc["event"] == "preempted" and r.doc["run_id"] == "low"
    assert r.doc["to_state"] == "PAUSING" and r.doc["actor"] == "scheduler"
    assert "preempted by run 'hi' (urgent)" in r.doc["reason"]
    assert r.headers["X-Segue-Delivery"] == str(
        transition_id(client, "low", "PAUSING", actor="scheduler"))
    for run in ("low", "hi"):
        with contextlib.suppress(Exception):
            client.cancel(run)


def test_a_killed_controllers_backlog_is_delivered_by_the_next_pump(
        segue: Segue, tmp_path: Path, secret_file: tuple[str, Path], _test_pool: Path) -> None:
    pytest.importorskip("fastapi", reason="the server extra is not installed")
    from server_helpers import serving

    from segue.server import create_app
    from segue.server import webhooks as _pump  # noqa: F401 - the server pumps webhooks

    secret, sfile = secret_file
    with receiver(refusing=True) as rec:
        add_hook(segue.home, rec.url, "running", sfile, "--backoff", "0.1", "--max-attempts", "100",
                 "--timeout", "1")
        segue("run", COUNTER, "--detach", "--run-id", "r", "-p", "n=20", "-p", "sleep=0",
              "-p", f"hold={tmp_path / 'gate'}", check=True)
        wait_for(lambda: len(rec.all()) >= 2, 30, "the controller to retry its delivery", poll=0.02)
        client = LocalClient(segue.home)
        ctl = client.store.get_run("r").controller_pid
        assert ctl is not None
        os.kill(ctl, signal.SIGKILL)  # mid-backlog: the delivery is queued, not delivered
        wait_for(lambda: not _alive(ctl), 10, "the controller to die")
        rec.refusing = False
        time.sleep(0.5)
        assert rec.accepted() == []  # nobody pumps now: the delivery waits in the outbox
        [d] = SQLiteOutbox(Home.resolve(segue.home).db_path).deliveries()
        assert d.status in ("pending", "sending") and d.attempts >= 2
        with serving(create_app(Home.resolve(segue.home), pool=_test_pool)):  # the next pump
            wait_for(lambda: rec.accepted(), 20, "the server to deliver the backlog", poll=0.05)
    running_id = str(transition_id(client, "r", "RUNNING"))
    [ok] = rec.accepted()
    assert ok.headers["X-Segue-Delivery"] == running_id and signature_ok(secret, ok)
    assert {r.headers["X-Segue-Delivery"] for r in rec.all()} == {running_id}  # retries of one
    assert int(ok.headers["X-Segue-Attempt"]) == len(rec.all())
    [d] = SQLiteOutbox(Home.resolve(segue.home).db_path).deliveries()
    assert d.status == "delivered"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    return True


# -- the pump on a real store -----------------------------------------------------------
def _home_with_hook(tmp_path: Path, url: str, events: list[str], **kw: Any) -> tuple[Home, Any]:
    home = Home.resolve(tmp_path / "home")
    store = home.open_store()
    hook = HooksFile(home).add(url, events, **kw)
    SQLiteOutbox(home.db_path).start_hook(hook.id)
    return home, store


def _fail_runs(store: Any, n: int) -> None:
    for i in range(n):
        store.create_run(NewRun(f"r{i}", "f", "/f.py", {}, {}), ["a"], actor="cli")
        store.transition_run(f"r{i}", RunState.RUNNING, actor="cli", reason="go")
        store.transition_run(f"r{i}", RunState.FAILED, actor="controller", reason="boom")


def _pump_until_idle(home: Home, timeout: float = 10) -> None:
    """Pump until no delivery is pending or being sent (by this pump or another)."""
    p = Pump(home)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            p.run_once()
            if not any(s in ("pending", "sending") for _, s in p.outbox.counts()):
                return
            time.sleep(0.05)
    finally:
        p.close()


def test_two_pumps_racing_send_each_delivery_once(tmp_path: Path) -> None:
    with receiver(delay_s=0.01) as rec:
        home, store = _home_with_hook(tmp_path, rec.url, ["failed"])
        _fail_runs(store, 30)
        pumps = [threading.Thread(target=_pump_until_idle, args=(home,)) for _ in range(3)]
        for t in pumps:
            t.start()
        for t in pumps:
            t.join(30)
    ids = [r.headers["X-Segue-Delivery"] for r in rec.all()]
    assert len(ids) == 30 and len(set(ids)) == 30


def test_redirects_are_not_followed_and_timeouts_are_retried(tmp_path: Path) -> None:
    with receiver(answer=302) as rec:
        home, store = _home_with_hook(tmp_path, f"{rec.url}/hook", ["failed"], backoff_s=0.05)
        _fail_runs(store, 1)
        _pump_until_idle(home)
    assert [r.path for r in rec.all()] == ["/hook"]  # once, and never to the Location
    [d] = SQLiteOutbox(home.db_path).deliveries()
    assert d.status == "failed" and "redirects are not followed" in (d.last_error or "")

    with receiver(delay_s=1.5) as rec:
        home, store = _home_with_hook(tmp_path / "t", rec.url, ["failed"], backoff_s=0.05,
                                      timeout_s=0.3, max_attempts=2)
        _fail_runs(store, 1)
        _pump_until_idle(home)
    [d] = SQLiteOutbox(home.db_path).deliveries()
    assert d.status == "failed" and d.attempts == 2 and "timed out" in (d.last_error or "")


@pytest.mark.parametrize("url, message", [
    ("ftp://example.com/x", r"must be http:// or https://; ftp: is refused"),
    ("file:///etc/passwd", r"must be http:// or https://; file: is refused"),
    ("/relative", r"must be http:// or https://; a relative URL is refused"),
    ("https://user:pw@example.com/x", r"carries credentials"),
    ("http:///nohost", r"has no host"),
])
def test_non_http_urls_are_refused(tmp_path: Path, url: str, message: str) -> None:
    home = Home.resolve(tmp_path / "home")
    with pytest.raises(UsageError, match=message):
        HooksFile(home).add(url, ["failed"])
    assert not (home.root / "webhooks.json").exists()


def test_hooks_file_is_private_and_rm_forgets_deliveries(tmp_path: Path,
                                                         secret_file: tuple[str, Path]) -> None:
    home = tmp_path / "home"
    hook = add_hook(home, "https://example.invalid/x", "failed", secret_file[1])
    path = Home.resolve(home).root / "webhooks.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["hooks"][0]["secret"] == secret_file[0]
    assert webhook(home, "rm", hook)[0] == 0
    assert json.loads(path.read_text())["hooks"] == []
    with pytest.raises(UsageError, match=r"^no webhook 'h00000000'"):
        webhook(home, "rm", "h00000000")


def test_an_old_home_gets_the_outbox(tmp_path: Path) -> None:
    """A home written by a segue before the outbox (schema 2) is migrated when opened."""
    db = tmp_path / "home" / "segue.db"
    db.parent.mkdir()
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn, "old", MIGRATIONS[:2])
    conn.execute("INSERT INTO runs (run_id, flow_name, flow_path, params, fingerprint, options, state,"
                 " created_at, updated_at) VALUES ('old', 'f', '/f.py', '{}', '{}', '{}', 'PAUSED', 1, 1)")
    conn.close()
    with receiver() as rec:
        home = Home.resolve(db.parent)
        hook = HooksFile(home).add(rec.url, ["cancelled"])
        SQLiteOutbox(db).start_hook(hook.id)
        home.open_store().transition_run("old", RunState.CANCELLED, actor="cli", reason="done")
        _pump_until_idle(home)
    assert [r.doc["event"] for r in rec.all()] == ["cancelled"]
    conn = sqlite3.connect(db)
    assert schema_version(conn) == MIGRATIONS[-1].version
    assert conn.execute("SELECT run_id FROM runs").fetchall() == [("old",)]
    conn.close()


# -- a home whose store is PostgreSQL ------------------------------------------------------
@pytest.fixture
def pg_home(pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    url = pg.create_database()
    monkeypatch.setenv("SEGUE_STORE", url)
    try:
        yield tmp_path / "pg-home"
    finally:
        pg.drop_database(url)


def test_webhooks_on_a_postgres_home(pg_home: Path, secret_file: tuple[str, Path]) -> None:
    """The CLI's add / flush / ls / deliveries / rm, and racing pumps, on the database:
    every transition after the hook arrives once, signed, its event id the delivery id."""
    secret, sfile = secret_file
    store = Home.resolve(pg_home).open_store()
    try:
        _fail_runs(store, 1)  # before the hook: never sent
        with receiver(fail_first=1) as rec:
            hook = add_hook(pg_home, rec.url, "failed", sfile, "--backoff", "0.05")
            for i in range(1, 4):
                store.create_run(NewRun(f"r{i}", "f", "/f.py", {}, {}), ["a"], actor="cli")
                store.transition_run(f"r{i}", RunState.RUNNING, actor="cli", reason="go")
                store.transition_run(f"r{i}", RunState.FAILED, actor="controller", reason="boom")
            code, out = webhook(pg_home, "flush", "--timeout", "20")
            assert (code, out.strip()) == (0, "delivered 3, gave up 0, still pending 0")
            pumps = [threading.Thread(target=_pump_until_idle, args=(Home.resolve(pg_home),))
                     for _ in range(2)]
            for t in pumps:
                t.start()
            for t in pumps:
                t.join(30)
        failed = {transition_id(LocalClient(pg_home), f"r{i}", "FAILED"): f"r{i}" for i in range(1, 4)}
        got = {int(r.headers["X-Segue-Delivery"]): r.doc["run_id"] for r in rec.accepted()}
        assert got == failed and len(rec.accepted()) == 3  # each once, none from before
        assert len(rec.all()) == 4 and all(signature_ok(secret, r) for r in rec.all())
        code, out = webhook(pg_home, "ls", "--json")
        [h] = json.loads(out)
        assert h["id"] == hook and h["deliveries"]["delivered"] == 3
        code, out = webhook(pg_home, "deliveries", "--json")
        assert sorted(d["delivery"] for d in json.loads(out)) == sorted(failed)
        assert webhook(pg_home, "rm", hook) == (0, f"webhook {hook} removed (3 deliveries forgotten)\n")
    finally:
        store.close()
    db = Home.resolve(pg_home).db_path  # nothing of it went to an SQLite file
    if db.exists() and db.stat().st_size:
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'notify_outbox'"
                            ).fetchone() == (0,)
        conn.close()
