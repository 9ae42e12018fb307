"""What a run produced, as records, and how two such snapshots differ.

A snapshot holds every step's committed output and every file the run wrote
in its working directory (sinks with relative paths land there). Record
files are compared record by record as multisets: JSON Lines by line, CSV by
row, Parquet by row, SQLite databases by table row (not segue's own
bookkeeping tables: a SQL sink's ledger, owners and staging, which name the
run and count its attempts); any other file counts as one record, its bytes.

The two runs have different run ids, so a sink names its parts differently
in each (a hash of run and step): records are compared, not names, and the
run id in an output value or a file's path reads ``<run>`` in both.
"""

from __future__ import annotations

import csv
import hashlib
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import checkpoint as ckpt
from .._canon import canonical_json
from ..home import Home
from ..run.stepio import GATHER

SKIP_DIRS = {".segue", "__pycache__"}
RECORD_SUFFIXES = {".jsonl", ".ndjson", ".csv", ".parquet"}
# segue.data.sinks.sql and .sql_owner: bookkeeping, not output.
SEGUE_TABLES = ("segue_sink_ledger", "segue_sink_owner")
SEGUE_TABLE_PREFIX = "segue_staged_"


def _norm_text(text: str, sandbox: str | None, run_id: str | None) -> str:
    if sandbox and sandbox in text:
        text = text.replace(sandbox, "<sandbox>")
    if run_id and run_id in text:
        text = text.replace(run_id, "<run>")
    return text


def _norm(value: Any, sandbox: str | None = None, run_id: str | None = None) -> Any:
    """A JSON-able, canonical form of an output value (arrays by dtype, shape and hash).

    Paths inside the run's sandbox are written relative to it, and the run's
    id as ``<run>`` (a dead-letter sink's path holds it), so the two runs'
    outputs compare equal when they name the same relative files.
    """
    if isinstance(value, dict):
        return {_norm_text(str(k), sandbox, run_id): _norm(v, sandbox, run_id) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_norm(v, sandbox, run_id) for v in value]
    if isinstance(value, str):
        return _norm_text(value, sandbox, run_id)
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        return {"dtype": str(arr.dtype), "shape": list(arr.shape),
                "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        return _norm(value.detach().cpu().numpy())
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, bytes):
        return {"bytes_sha256": hashlib.sha256(value).hexdigest()}
    return value


def _file_records(path: Path) -> list[str]:
    name = path.name
    if name.endswith((".jsonl", ".ndjson")):
        import json

        out = []
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    out.append(canonical_json(json.loads(line)))
                except ValueError:
                    out.append(line)
        return out
    if name.endswith(".csv"):
        with open(path, newline="") as f:
            return [canonical_json(row) for row in csv.reader(f)][1:]  # rows after the header
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            return [hashlib.sha256(path.read_bytes()).hexdigest()]
        return [canonical_json(_norm(r)) for r in pq.read_table(path).to_pylist()]
    if name.endswith((".db", ".sqlite", ".sqlite3")):
        recs = []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                      if r[0] not in SEGUE_TABLES and not r[0].startswith(SEGUE_TABLE_PREFIX)]
            for t in tables:
                for row in conn.execute(f'SELECT * FROM "{t}"'):  # noqa: S608 - names from the catalog
                    recs.append(canonical_json([t, _norm(list(row))]))
        finally:
            conn.close()
        return recs
    return [hashlib.sha256(path.read_bytes()).hexdigest()]


@dataclass
class Snapshot:
    outputs: dict[str, Any] = field(default_factory=dict)  # step -> canonical output
    files: dict[str, Counter[str]] = field(default_factory=dict)  # relative path -> records
    # step -> where its sinks wrote, as a data step's output reports them (its
    # "sink" and "dead_letter"): what verify checks lies inside the sandbox.
    sinks: dict[str, list[str]] = field(default_factory=dict)


def reported_sinks(value: Any) -> list[str]:
    """The sinks a data step's output names (segue.data.driver's summary), or []."""
    if not isinstance(value, dict) or not isinstance(value.get("sink"), str):
        return []
    return [v for v in (value.get("sink"), value.get("dead_letter")) if isinstance(v, str)]


def snapshot(workdir: Path, home: Home, run_id: str) -> Snapshot:
    store = home.open_store()
    storage = home.run_storage(store.get_run(run_id))
    snap = Snapshot()
    for t in store.get_tasks(run_id):
        # A fan-out's own output is its items' (each compared as its own task).
        if t.output_ref is not None and not t.output_ref.startswith(GATHER):
            value = ckpt.load(storage, t.output_ref).state["value"]
            snap.outputs[t.step] = _norm(value, str(workdir.resolve()), run_id)
            if sinks := reported_sinks(value):
                snap.sinks[t.step] = sinks
    snap.files = snapshot_files(workdir, run_id)
    return snap


def snapshot_files(workdir: Path, run_id: str | None = None) -> dict[str, Counter[str]]:
    """The records of every file under ``workdir``, pooled per directory for record files.

    In a segue sink's directory only the published set counts (the parts of
    the run that owns it, segue.data.sinks.owner): parts of a run an
    overwrite replaced, or of a writer that lost the directory, are not output.
    """
    from ..data.sinks.owner import unpublished

    files: dict[str, Counter[str]] = {}
    hidden: dict[Path, set[str]] = {}
    for p in sorted(workdir.rglob("*")):
        rel = p.relative_to(workdir)
        if not p.is_file() or any(part.startswith(".") for part in rel.parts) or set(rel.parts) & SKIP_DIRS:
            continue
        if p.parent not in hidden:
            hidden[p.parent] = unpublished(str(p.parent))
        if p.name in hidden[p.parent]:
            continue
        # Record files are pooled per directory: how a sink cuts its output into
        # part files depends on when checkpoints happened, not on the records.
        key = (rel.parent.as_posix() + "/*" + p.suffix) if p.suffix in RECORD_SUFFIXES else rel.as_posix()
        files.setdefault(_norm_text(key, None, run_id), Counter()).update(_file_records(p))
    return files


@dataclass
class Diff:
    records: int = 0  # records of the clean run's files that were compared
    outputs: int = 0  # step outputs compared
    lost: int = 0
    duplicated: int = 0
    differing: int = 0
    missing_files: list[str] = field(default_factory=list)
    extra_files: list[str] = field(default_factory=list)
    differing_outputs: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.lost or self.duplicated or self.differing or self.missing_files
                    or self.extra_files or self.differing_outputs)


def compare(clean: Snapshot, faulted: Snapshot, *, ignore_outputs: frozenset[str] | set[str] = frozenset()) -> Diff:
    d = Diff()
    for step in sorted(set(clean.outputs) | set(faulted.outputs)):
        if step in ignore_outputs:
            continue
        d.outputs += 1
        if clean.outputs.get(step) != faulted.outputs.get(step):
            d.differing_outputs.append(step)
    for rel in sorted(set(clean.files) | set(faulted.files)):
        a, b = clean.files.get(rel), faulted.files.get(rel)
        if b is None:
            d.missing_files.append(rel)
            d.lost += sum(a.values()) if a else 0
            continue
        if a is None:
            d.extra_files.append(rel)
            d.differing += sum(b.values())
            continue
        d.records += sum(a.values())
        for rec, n in a.items():
            m = b.get(rec, 0)
            if m < n:
                d.lost += n - m
            elif m > n:
                d.duplicated += m - n
                if len(d.examples) < 3:
                    d.examples.append(f"{rel}: duplicated {rec[:120]}")
        for rec, m in b.items():
            if rec not in a:
                d.differing += m
                if len(d.examples) < 3:
                    d.examples.append(f"{rel}: unexpected {rec[:120]}")
    return d
