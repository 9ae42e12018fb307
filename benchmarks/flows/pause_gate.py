"""What the benchmark flows share: atomic probe files and holding a record until the pause signal."""

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any


def write_atomic_text(directory: str, name: str, text: str) -> None:
    """``directory/name`` replaced at once: a reader never sees half a probe."""
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(directory, name))


def hold_for_pause(say_held: Callable[[], None], timeout_s: float = 300) -> None:
    """Call ``say_held``, then wait until this worker gets the pause signal (SIGUSR1,
    sent by the controller on `segue pause`), so the pause lands here on any machine."""
    got = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)

    def on_pause(signum: int, frame: Any) -> None:
        got.set()
        if callable(previous):
            previous(signum, frame)  # the worker's own handler: it sets the pause flag

    signal.signal(signal.SIGUSR1, on_pause)
    try:
        say_held()
        deadline = time.monotonic() + timeout_s
        while not got.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)  # the handler runs between these sleeps, in this thread
    finally:
        signal.signal(signal.SIGUSR1, previous)
