"""The listener a step's members on Ray dial in to (executor.doorman), with real sockets:
a caller that connects and says nothing, or has no key, holds up no member. No Ray
needed: this is the socket part of executor.ray_pool."""

from __future__ import annotations

import queue
import socket
import time
from multiprocessing.connection import Client, Connection
from multiprocessing.context import AuthenticationError
from typing import Any

import pytest

from segue.executor.doorman import Doorman

KEY = b"k" * 32


def _greeted() -> tuple[queue.Queue[tuple[Connection, Any]], Any]:
    got: queue.Queue[tuple[Connection, Any]] = queue.Queue()
    return got, lambda conn, first: got.put((conn, first))


def _eventually(check: Any, what: str) -> None:
    """Wait (bounded) for ``check()``: a greeting thread counts a refusal as it unwinds,
    which may be after the caller saw it."""
    for _ in range(1200):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def _read_to_eof(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return data


def test_a_silent_caller_holds_up_no_member_and_a_stranger_is_refused() -> None:
    got, on_greeted = _greeted()
    door = Doorman("127.0.0.1", KEY, on_greeted)
    silent = socket.create_connection(door.address)  # connects first, then says nothing
    try:
        with pytest.raises(AuthenticationError):
            Client(door.address, authkey=b"x" * 32)  # no key: refused, nothing of it unpickled
        with Client(door.address, authkey=KEY) as member:
            member.send(("hello", 0, "node", 1234, "id"))
            conn, first = got.get(timeout=60)  # admitted while the silent caller still hangs
            assert first == ("hello", 0, "node", 1234, "id")
            conn.send("recipe")
            assert member.recv() == "recipe"
            conn.close()
        _eventually(lambda: door.refused == 1, "the stranger counted as refused")
        assert door.refused == 1 and got.empty()  # the silent caller is not counted yet
    finally:
        door.close()
        silent.close()


def test_a_caller_silent_past_the_greeting_time_is_hung_up_on() -> None:
    got, on_greeted = _greeted()
    door = Doorman("127.0.0.1", KEY, on_greeted, greet_s=0.2)
    try:
        with socket.create_connection(door.address) as silent:
            challenge = _read_to_eof(silent, timeout=60)  # the challenge, then the end
        assert challenge, "the doorman sent no challenge"
        _eventually(lambda: door.refused == 1, "the silent caller counted as hung up on")
        assert got.empty()
    finally:
        door.close()


def test_closing_hangs_up_on_callers_mid_greeting_and_stops_listening() -> None:
    got, on_greeted = _greeted()
    door = Doorman("127.0.0.1", KEY, on_greeted)
    silent = socket.create_connection(door.address)
    try:
        silent.settimeout(60)
        assert silent.recv(4096)  # the challenge: its greeting thread is waiting on it now
        door.close()
        assert _read_to_eof(silent, timeout=60) == b""  # hung up on, not left waiting 30 s
        with pytest.raises(OSError):
            socket.create_connection(door.address, timeout=5).close()
        assert got.empty()
    finally:
        silent.close()
