"""Named fault points for fault injection, armed through the environment.

``SEGUE_FAULTS="checkpoint.blobs_written:kill,worker.after_commit:raise:2"``
arms two points. Actions: ``kill`` (SIGKILL this process), ``raise``
(:class:`~segue.errors.InjectedFault`), ``exit`` (``os._exit(70)``), ``stop``
(SIGSTOP this process), ``enospc`` (``OSError(ENOSPC)``, a full disk). The optional count fires the action on the N-th hit
only (1-based), so a test can kill at "the third checkpoint"; ``N-M`` fires it on every
hit from the N-th to the M-th (a disk that stays full for a while).

``SEGUE_FAULTS_IN=worker`` (or ``controller``) arms them only in processes of
that role, and ``SEGUE_FAULTS_EPOCHS=1,3`` only in the attempts with those
epochs, so a test can kill the first attempt and let the retry succeed.

Unarmed points cost one dict lookup: they are safe to leave in hot paths.
"""

from __future__ import annotations

import errno
import os
import signal

from .errors import InjectedFault

_armed: dict[str, tuple[str, int, int]] | None = None
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int, int]]:
    armed: dict[str, tuple[str, int, int]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        name = parts[0]
        action = parts[1] if len(parts) > 1 else "raise"
        first, _, last = (parts[2] if len(parts) > 2 else "1").partition("-")
        if action not in ("kill", "raise", "exit", "stop", "enospc"):
            raise ValueError(f"SEGUE_FAULTS: unknown action {action!r} for point {name!r}")
        armed[name] = (action, int(first), int(last or first))
    return armed


def rearm(spec: str | None = None) -> None:
    """Re-read the armed points (from ``spec`` or the environment); resets hit counts."""
    global _armed
    _armed = _parse(spec if spec is not None else os.environ.get("SEGUE_FAULTS", ""))
    _hits.clear()


def fault_point(name: str) -> None:
    """Fire the action armed for ``name``, if any."""
    if _armed is None:
        rearm()
    assert _armed is not None
    if not _armed or name not in _armed:
        return
    action, first, last = _armed[name]
    _hits[name] = _hits.get(name, 0) + 1
    if not first <= _hits[name] <= last:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "exit":
        os._exit(70)
    elif action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"(injected at {name})")
    raise InjectedFault(f"injected fault at {name}")


def set_role(role: str, epoch: int | None = None) -> None:
    """Declare what this process is; disarms the points not meant for it."""
    roles = os.environ.get("SEGUE_FAULTS_IN")
    epochs = os.environ.get("SEGUE_FAULTS_EPOCHS")
    if roles is not None and role not in roles.split(","):
        rearm("")
    elif epochs is not None and epoch is not None and str(epoch) not in epochs.split(","):
        rearm("")
