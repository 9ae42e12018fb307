"""Where a segue installation keeps its state: ``--home``, ``$SEGUE_HOME`` or ``./.segue``.

Layout::

    HOME/segue.db                      metadata store (SQLite, WAL), unless one is configured:
    HOME/config.json                   {"store": "postgresql://..."} (or --store, $SEGUE_STORE)
    HOME/data/runs/RUN/STEP/ckpt/SEQ-eEPOCH/   checkpoints (MANIFEST.json last); a run
                                       started with --checkpoints URL keeps runs/... there
    HOME/data/runs/RUN/STEP/output-eEPOCH/     committed step outputs
    HOME/data/quarantine/...           checkpoints that failed verification
    HOME/logs/RUN/                     controller and worker logs
    HOME/logs/RUN/STEP.eN.log          output of attempt N of STEP (`segue logs`)
    HOME/prices.json                   prices per device type (`segue prices`)
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError

# fullmatch, not match with `$`: `$` also matches before a trailing newline.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# The home holds run parameters, logs and tokens: only its owner may enter it.
HOME_MODE = 0o700
DB_MODE = 0o600


def check_run_id(run_id: str) -> str:
    """Run ids become path components, so they are restricted (path containment)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise UsageError(
            f"run id {run_id!r} is invalid; use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return run_id


def _user_home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError):  # no $HOME and no passwd entry
        return None


@dataclass(frozen=True)
class Home:
    root: Path
    # The metadata store given explicitly (``segue --store URL``, ``Client(store=)``,
    # the record a controller hands its workers), which wins over ``$SEGUE_STORE`` and
    # ``config.json``; None: the home's own choice (segue.store.store_url). Carried
    # with the home, never exported, so every process this one starts is told it.
    # Not in the repr (a URL may hold a password) nor in comparisons (one home).
    store: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None, *, store: str | None = None) -> Home:
        raw = home if home is not None else os.environ.get("SEGUE_HOME", ".segue")
        return cls(Path(raw).expanduser().resolve(), store=store or None)

    def store_url(self) -> str | None:
        """The PostgreSQL URL this home's metadata lives at, or None for its SQLite file."""
        from .store import store_url

        return store_url(self.root, self.store)

    @property
    def db_path(self) -> Path:
        return self.root / "segue.db"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def logs_dir(self, run_id: str) -> Path:
        d = self.root / "logs" / check_run_id(run_id)
        self.ensure()
        d.mkdir(parents=True, exist_ok=True)
        return d

    def exists(self) -> bool:
        """Whether the home has a store: its segue.db, or a configured database (which
        another machine may have filled: a fresh home directory still sees its runs)."""
        if self.db_path.exists():
            return True
        return self.store_url() is not None

    def ensure(self) -> Path:
        """Create the home private to its owner (0700), or make an existing one so.

        Under the usual umask 022 everything inside would be world-readable;
        a private root makes every entry below it unreachable for others,
        whatever its own mode. An existing directory is tightened only when it
        is ours, unless it is a folder shared by design (sticky, like /tmp) or
        the user's own home folder.
        """
        root = self.root
        try:
            if not root.exists():
                root.parent.mkdir(parents=True, exist_ok=True)
                try:
                    root.mkdir(mode=HOME_MODE)
                except FileExistsError:  # another process created it first: tighten below
                    pass
            if not root.is_dir():
                raise UsageError(f"segue home {root} is not a directory; pass --home a directory")
        except OSError as exc:
            raise UsageError(f"cannot create segue home {root} ({exc.strerror}); "
                             f"pass --home a writable directory") from None
        st = root.stat()
        ours = st.st_uid == os.geteuid()
        # A sticky folder (like /tmp) is shared by design, and the user's own
        # home folder or / are not segue's to lock: their database is still 0600.
        shared = st.st_mode & stat.S_ISVTX or root in (_user_home(), Path("/"))
        if ours and stat.S_IMODE(st.st_mode) & 0o077 and not shared:
            os.chmod(root, stat.S_IMODE(st.st_mode) & 0o700)
        if not self.db_path.exists():
            # SQLite creates the -wal and -shm files with the database's mode.
            os.close(os.open(self.db_path, os.O_WRONLY | os.O_CREAT, DB_MODE))
        elif ours and stat.S_IMODE(self.db_path.stat().st_mode) & 0o077:
            os.chmod(self.db_path, DB_MODE)
        return root

    def open_store(self):  # -> Store; imported lazily to keep `segue --help` fast
        from .store import open_store

        self.ensure()
        return open_store(self.root, self.store)

    def storage(self, url: str = ""):  # -> CheckpointStorage
        """Checkpoint storage at ``url`` (a run's ``checkpoints`` option): the home's data
        directory for "", an absolute path, or any fsspec URL (s3://bucket/prefix)."""
        from .checkpoint import LocalStorage

        if url:
            return storage_at(url)
        self.ensure()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return LocalStorage(self.data_dir)

    def run_storage(self, run):  # (RunRecord) -> CheckpointStorage
        """Where ``run`` keeps its checkpoints and step outputs, on any host."""
        return self.storage(str(run.options.get("checkpoints") or ""))


def storage_at(url: str):  # -> CheckpointStorage
    """Checkpoint storage at an absolute path, a file:// URL or any fsspec URL."""
    from .checkpoint import FsspecStorage, LocalStorage

    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" in url:
        return FsspecStorage(url)
    Path(url).mkdir(parents=True, exist_ok=True)
    return LocalStorage(Path(url))


def checkpoint_path(run_id: str, step: str, seq: int, epoch: int) -> str:
    return f"runs/{run_id}/{step}/ckpt/{seq:08d}-e{epoch}"


def output_path(run_id: str, step: str, epoch: int) -> str:
    return f"runs/{run_id}/{step}/output-e{epoch}"
