"""Where a segue installation keeps its state: ``--home``, ``$SEGUE_HOME`` or ``./.segue``.

Layout::

    HOME/segue.db                      metadata store (SQLite, WAL)
    HOME/data/runs/RUN/STEP/ckpt/SEQ-eEPOCH/   checkpoints (MANIFEST.json last)
    HOME/data/runs/RUN/STEP/output-eEPOCH/     committed step outputs
    HOME/data/quarantine/...           checkpoints that failed verification
    HOME/logs/RUN/                     controller and worker logs
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_run_id(run_id: str) -> str:
    """Run ids become path components, so they are restricted (path containment)."""
    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise UsageError(
            f"run id {run_id!r} is invalid; use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return run_id


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None) -> Home:
        raw = home if home is not None else os.environ.get("SEGUE_HOME", ".segue")
        return cls(Path(raw).expanduser().resolve())

    @property
    def db_path(self) -> Path:
        return self.root / "segue.db"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def logs_dir(self, run_id: str) -> Path:
        d = self.root / "logs" / check_run_id(run_id)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def exists(self) -> bool:
        return self.db_path.exists()

    def open_store(self):  # -> Store; imported lazily to keep `segue --help` fast
        from .store import open_store

        return open_store(self.root)

    def storage(self):  # -> CheckpointStorage
        from .checkpoint import LocalStorage

        self.data_dir.mkdir(parents=True, exist_ok=True)
        return LocalStorage(self.data_dir)


def checkpoint_path(run_id: str, step: str, seq: int, epoch: int) -> str:
    return f"runs/{run_id}/{step}/ckpt/{seq:08d}-e{epoch}"


def output_path(run_id: str, step: str, epoch: int) -> str:
    return f"runs/{run_id}/{step}/output-e{epoch}"
