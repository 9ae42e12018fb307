"""File sinks (JSONL, Parquet): staged parts renamed into place after the commit.

Layout of an output directory ``OUT``::

    OUT/part-TAG-SHARD-PART.jsonl                published (deterministic names;
                                                 TAG: a hash of run and step)
    OUT/.segue-owner.json                        who owns OUT (segue.data.sinks.owner)
    OUT/.segue-staging/RUN/STEP/FENCE            highest epoch that opened the sink (kept)
    OUT/.segue-staging/RUN/STEP/eEPOCH-pPART-SHARD.jsonl   staged, not yet committed

With parallel sub-workers (``Scope.worker`` = K) each sub-worker stages under
``.segue-staging/RUN/STEP/wK/`` (its own FENCE, its own cleanup) and publishes
``part-TAG-SHARD-wK-PART.jsonl``: a shard can move between sub-workers across
restarts, and the worker tag keeps their part numbers from colliding.

Staging lives on the same filesystem, so publishing one part is one atomic
``os.replace``. A directory (and ``prefix``) belongs to one step of one run:
another run is refused unless it asks for ``mode="append"`` or
``mode="overwrite"`` (see :mod:`.owner`). Opened without a committed state (a
first start, or ``--restart-step``), the sink deletes every part its run and
step published before, so starting over never duplicates output. Only local
paths are supported: object stores have no rename (to do: write the parts in
place and a manifest last).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from .._fsio import fence, fsync_dir
from ..errors import DataError, StagedOutputLostError
from .base import Scope, Sink
from .owner import MODES, Ownership, Writer, tag_of


class FileSink(Sink):
    ext = ""
    supports_workers = True

    def __init__(self, directory: str | os.PathLike[str], *, prefix: str = "", mode: str = "new") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.prefix = prefix
        self.mode = mode
        self._own: Ownership | None = None
        self._tag = ""  # the writer's tag (run and step) in published names
        self._wtag = ""  # "wK-" for sub-worker K of a parallel step
        self._final = self._final_pattern()
        self._scope: Scope | None = None
        self._next_part = 0
        self._pending: list[dict[str, Any]] = []  # closed parts, not yet published
        self._staged = 0  # how many of them the last stage() covered (publish() publishes those)
        self._cur: dict[str, Any] | None = None  # the open part

    # -- naming ---------------------------------------------------------------
    def _final_pattern(self) -> re.Pattern[str]:
        # Only this writer's parts: "part-SHARD-PART" never matches "part-SHARD-wK-PART".
        return re.compile(rf"^{re.escape(self.prefix)}part-{re.escape(self._tag)}-[A-Za-z0-9.]+-"
                          rf"{re.escape(self._wtag)}(\d{{8}}){re.escape(self.ext)}$")

    @property
    def staging(self) -> str:
        if self._scope is None:
            raise RuntimeError("sink used before open()")
        base = os.path.join(self.directory, ".segue-staging", self._scope.run_id, self._scope.step)
        return base if self._scope.worker is None else os.path.join(base, f"w{self._scope.worker}")

    def final_name(self, shard: str, part: int) -> str:
        return f"{self.prefix}part-{self._tag}-{shard}-{self._wtag}{part:08d}{self.ext}"

    # -- format hooks -----------------------------------------------------------
    @abstractmethod
    def _open_file(self, path: str) -> Any:
        ...

    @abstractmethod
    def _append(self, handle: Any, records: Sequence[Any]) -> None:
        ...

    @abstractmethod
    def _close_file(self, handle: Any) -> None:
        ...

    # -- protocol ---------------------------------------------------------------
    @property
    def ownership(self) -> Ownership:
        if self._own is None:
            raise RuntimeError("sink used before open()")
        return self._own

    def preflight(self, run_id: str, step: str) -> None:
        Ownership(self.directory, self.prefix, self.ext, Writer(run_id, step), self.mode).preflight()

    def open(self, scope: Scope, state: dict[str, Any] | None) -> None:
        self._scope = scope
        self._tag = tag_of(scope.run_id, scope.step)
        self._wtag = "" if scope.worker is None else f"w{int(scope.worker)}-"
        self._final = self._final_pattern()
        os.makedirs(self.directory, exist_ok=True)
        own = self._own = Ownership(self.directory, self.prefix, self.ext,
                                    Writer(scope.run_id, scope.step), self.mode)
        own.claim_at_open()  # refuses a directory another run owns, before anything is written
        with fence(self.staging, scope.epoch, advance=True):
            if state is not None:
                # Parts already committed (next_part > 0): an overwrite takes the
                # directory now if its first publish died before the switch.
                with own.publishing(claim=int(state["next_part"]) > 0):
                    self._roll_forward(state["pending"])
                self._roll_back_published(int(state["next_part"]))
            else:
                # No committed state: whatever this run's step published before
                # (a restart of the step) is not covered by anything; drop it.
                own.discard_mine(None if scope.worker is None else self._wtag)
            for name in os.listdir(self.staging):
                path = os.path.join(self.staging, name)
                # Sub-worker directories (wK/) belong to their sub-worker's own open().
                if name != "FENCE" and not os.path.isdir(path):
                    os.unlink(path)
        self._next_part = 0 if state is None else int(state["next_part"])
        self._pending, self._staged = [], 0

    def _roll_forward(self, pending: list[dict[str, Any]]) -> None:
        for p in pending:
            staged = os.path.join(self.staging, p["staged"])
            final = os.path.join(self.directory, p["final"])
            if os.path.exists(staged):
                os.replace(staged, final)
            elif not os.path.exists(final):
                raise StagedOutputLostError(
                    f"committed output {p['staged']} of {self.directory} is neither staged nor published; "
                    f"the staging area was modified outside segue"
                )
        if pending:
            fsync_dir(self.directory)

    def _roll_back_published(self, next_part: int) -> None:
        # Parts at or past next_part were published by a checkpoint newer than
        # the one restored (it was quarantined); they will be produced again.
        for name in os.listdir(self.directory):
            m = self._final.match(name)
            if m and int(m.group(1)) >= next_part:
                os.unlink(os.path.join(self.directory, name))

    def write(self, records: Sequence[Any], shard: str, keys: Sequence[str] | None = None) -> None:
        if not records:
            return
        if self._cur is not None and self._cur["shard"] != shard:
            self._close_part()
        if self._cur is None:
            if self._scope is None:
                raise RuntimeError("sink used before open()")
            part = self._next_part
            self._next_part += 1
            staged = f"e{self._scope.epoch}-p{part:08d}-{shard}{self.ext}"
            self._cur = {"shard": shard, "part": part, "staged": staged, "records": 0,
                         "handle": self._open_file(os.path.join(self.staging, staged))}
        self._append(self._cur["handle"], records)
        self._cur["records"] += len(records)

    def _close_part(self) -> None:
        cur, self._cur = self._cur, None
        if cur is None:
            return
        self._close_file(cur["handle"])
        self._pending.append({"staged": cur["staged"], "final": self.final_name(cur["shard"], cur["part"]),
                              "records": cur["records"]})

    def stage(self) -> None:
        self._close_part()
        self._staged = len(self._pending)
        if self._pending:
            fsync_dir(self.staging)

    def state(self) -> dict[str, Any]:
        if self._cur is not None:
            raise DataError("sink state taken with an open part; call stage() first")
        return {"next_part": self._next_part, "pending": list(self._pending)}

    def publish(self) -> None:
        if self._scope is None:
            raise RuntimeError("sink used before open()")
        # Only what the checkpoint covers: a part closed since stage() (a sub-worker
        # writes on while its coordinator commits) waits for the next checkpoint.
        covered, self._pending = self._pending[:self._staged], self._pending[self._staged:]
        self._staged = 0
        if not covered:
            return
        with fence(self.staging, self._scope.epoch, advance=False), self.ownership.publishing(claim=True):
            for p in covered:
                os.replace(os.path.join(self.staging, p["staged"]), os.path.join(self.directory, p["final"]))
            fsync_dir(self.directory)

    def finish(self) -> None:
        # Keep FENCE: it is what refuses a zombie's publish after the step is done.
        for name in os.listdir(self.staging):
            if name != "FENCE":
                path = os.path.join(self.staging, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)

    def close(self) -> None:
        if self._cur is not None:
            try:
                self._cur["handle"].close()
            except Exception:  # noqa: BLE001 - an aborted attempt; recovery deletes the file
                pass
            self._cur = None

    def describe(self) -> str:
        return self.directory


class JsonlSink(FileSink):
    """One JSON document per line; parts are UTF-8 text."""

    ext = ".jsonl"

    def _open_file(self, path: str) -> Any:
        return open(path, "wb", buffering=1 << 20)

    def _append(self, handle: Any, records: Sequence[Any]) -> None:
        dumps = json.dumps
        handle.write(("\n".join([dumps(r) for r in records]) + "\n").encode())

    def _close_file(self, handle: Any) -> None:
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()


class ParquetSink(FileSink):
    """Parquet parts; the schema is inferred from a part's first rows (dict records)."""

    ext = ".parquet"

    def __init__(self, directory: str | os.PathLike[str], *, prefix: str = "", mode: str = "new",
                 row_group_rows: int = 65_536) -> None:
        super().__init__(directory, prefix=prefix, mode=mode)
        self.row_group_rows = row_group_rows

    def _open_file(self, path: str) -> Any:
        return {"path": path, "writer": None, "buf": [], "schema": None}

    def _flush(self, h: dict[str, Any]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not h["buf"]:
            return
        table = pa.Table.from_pylist(h["buf"], schema=h["schema"])
        if h["writer"] is None:
            h["schema"] = table.schema
            h["writer"] = pq.ParquetWriter(h["path"], table.schema)
        h["writer"].write_table(table)
        h["buf"] = []

    def _append(self, handle: Any, records: Sequence[Any]) -> None:
        handle["buf"].extend(records)
        if len(handle["buf"]) >= self.row_group_rows:
            self._flush(handle)

    def _close_file(self, handle: Any) -> None:
        self._flush(handle)
        if handle["writer"] is not None:
            handle["writer"].close()
        fd = os.open(handle["path"], os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
