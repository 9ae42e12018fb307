"""The listener an attempt's actor opens for its worker (executor.ray_dial), handed to a
real child process: members dial before it accepts, only a keyed one gets through, and
the key never sits in the child's environment. No Ray needed: this is the socket part."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from multiprocessing.context import AuthenticationError
from pathlib import Path

import pytest

from segue.executor import ray_dial

SRC = Path(__file__).resolve().parents[2] / "src"

CHILD = r"""
import os, sys
from segue.executor.ray_dial import ENV, DialListener
listener = DialListener.inherited()
print("env-gone" if ENV not in os.environ else "env-kept", flush=True)
print("no-second" if DialListener.inherited() is None else "second", flush=True)
sys.stdin.readline()  # the test says when to accept: its members dialled meanwhile
for _ in range(3):
    try:
        conn = listener.accept()
    except Exception as exc:
        print("refused", type(exc).__name__, flush=True)
        continue
    conn.send(("echo", conn.recv()))
    conn.close()
listener.close()
"""


def test_members_dial_before_the_worker_accepts_and_only_the_keyed_get_through(tmp_path: Path) -> None:
    sock, key = ray_dial.open_listener("127.0.0.1", backlog=8)
    address = sock.getsockname()[:2]
    env, fds, key_r = ray_dial.hand_over(sock, key)
    child = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, **env, "PYTHONPATH": str(SRC)},
                             pass_fds=fds, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # The parent (the attempt's actor) keeps no copy: the child's is the only listener left.
    sock.close()
    os.close(key_r)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "env-gone"  # taken once, not left for its children
        assert child.stdout.readline().strip() == "no-second"
        environ = Path(f"/proc/{child.pid}/environ").read_bytes()
        assert key not in environ and key.hex().encode() not in environ
        got: dict[str, object] = {}

        def handshake(name: str, conn: Connection, authkey: bytes) -> None:
            try:  # what multiprocessing.connection.Client does once connected
                answer_challenge(conn, authkey)
                deliver_challenge(conn, authkey)
                conn.send(name)
                got[name] = conn.recv()
            except AuthenticationError as exc:
                got[name] = f"refused: {exc}"
            finally:
                conn.close()

        # Both connect while the child is not accepting yet: they wait in the backlog.
        early = {name: Connection(socket.create_connection(address).detach()) for name in ("stranger", "member")}
        stranger = threading.Thread(target=handshake, args=("stranger", early["stranger"],
                                                            b"x" * ray_dial.KEY_BYTES))
        member = threading.Thread(target=handshake, args=("member", early["member"], key))
        stranger.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        stranger.join(30)
        member.start()
        member.join(30)
        with Client(address, authkey=key) as conn:  # and one that dials once it listens
            conn.send("late")
            got["late"] = conn.recv()
        assert got["member"] == ("echo", "member") and got["late"] == ("echo", "late"), got
        assert str(got["stranger"]).startswith("refused"), got
        assert child.stdout.readline().split() == ["refused", "AuthenticationError"]
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.communicate()  # (closes its pipes)


def test_a_key_cut_short_is_an_error_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    sock, _ = ray_dial.open_listener("127.0.0.1", backlog=1)
    env, _, key_r = ray_dial.hand_over(sock, b"short")
    monkeypatch.setenv(ray_dial.ENV, env[ray_dial.ENV].replace(str(sock.fileno()), str(os.dup(sock.fileno()))))
    with pytest.raises(RuntimeError, match="is 5 bytes, not 32: the attempt's actor did not hand it over whole"):
        ray_dial.DialListener.inherited()
    with pytest.raises(OSError):
        os.fstat(key_r)  # the pipe's read end was closed, as it is after a whole key
    sock.close()
