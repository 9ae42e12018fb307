"""How a worker's end is told to its controller: exit codes and the exit report file.

Kept apart from the worker so the controller can read them without importing
the worker (and with it the checkpoint engine and NumPy).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..home import Home

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PARKED = 3
EXIT_FENCED = 4
EXIT_ORPHANED = 5
# EXIT_DISK_FULL = 6 (see .outage): a write failed for lack of space; the run pauses.


def exit_report_path(home: Home, run_id: str, step: str, epoch: int) -> Path:
    return home.logs_dir(run_id) / f"{step}.e{epoch}.exit.json"


def write_exit_report(path: Path, doc: dict[str, Any]) -> None:
    """Leave ``doc`` ({"error", "traceback", "retryable"}) where the controller reads it,
    atomically; on a full disk nothing (the exit code still tells the controller)."""
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
