"""Who owns a file sink's output: the ownership marker and the publish protocol.

An output directory, for one ``prefix``, belongs to one step of one run. The
marker ``OUT/.segue-owner{-PREFIX}.json`` says which (it is a dot-file, so
sources and ``segue verify`` never read it as data)::

    {"v": 1, "prefix": "", "owner": {"run_id": R, "step": S},
     "members": [{"run_id": R, "step": S}, ...],   owner first, then appenders
     "adopted": [names],       part files found before any run claimed the directory
     "retired": [{"run_id", "step"}, ...],   writers replaced by an overwrite
     "retire": [names]}        parts of retired writers still to delete

Every published part carries its writer's tag (a hash of run and step):
``PREFIX part-TAG-SHARD-PART.ext``. The **published set** is the parts whose
tag belongs to a member, plus the adopted names: :func:`published_parts` is
how a reader (segue's sources, ``segue verify``) sees it. The marker changes
only under the directory's lock (``.segue-owner.lock``) and only by an atomic
replace, so a reader sees the old set or the new one, never a mix:

* ``mode="new"`` (default): a directory owned by another writer, or holding
  part files no run claims, is refused (:class:`SinkOwnedError`).
* ``mode="append"``: the writer joins the members at open.
* ``mode="overwrite"``: at its first publish, after its parts were renamed
  into place (invisible: not a member yet), one marker replace makes it the
  only member; the old parts are then deleted (``retire``, rolled forward by
  whoever takes the lock next if this process dies).

A writer that an overwrite retired is refused from then on, so two runs
cannot take the directory back and forth.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..._faults import fault_point
from .._fsio import fsync_dir, write_atomic
from ..errors import SinkOwnedError

MODES = ("new", "append", "overwrite")
LOCK = ".segue-owner.lock"
VERSION = 1


def tag_of(run_id: str, step: str) -> str:
    """The writer's tag in published names: stable across its attempts, distinct between writers."""
    return hashlib.blake2b(f"{run_id}/{step}".encode(), digest_size=4).hexdigest()


def marker_name(prefix: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", prefix)
    return f".segue-owner-{safe}.json" if prefix else ".segue-owner.json"


def part_pattern(prefix: str, ext: str) -> re.Pattern[str]:
    """Every published part of ``prefix`` (group 1: the writer's tag, None for untagged names)."""
    return re.compile(rf"^{re.escape(prefix)}part-(?:([0-9a-f]{{8}})-)?[A-Za-z0-9.]+-(?:w\d+-)?\d{{8}}"
                      rf"{re.escape(ext)}$")


@dataclass(frozen=True)
class Writer:
    run_id: str
    step: str

    @property
    def tag(self) -> str:
        return tag_of(self.run_id, self.step)

    def to_json(self) -> dict[str, str]:
        return {"run_id": self.run_id, "step": self.step}

    def describe(self) -> str:
        return f"run {self.run_id!r} (step {self.step!r})"


def _writer(d: dict[str, Any]) -> Writer:
    return Writer(str(d["run_id"]), str(d["step"]))


def read_marker(directory: str, prefix: str = "") -> dict[str, Any] | None:
    """The ownership marker of ``directory`` for ``prefix``, or None if no run claimed it."""
    try:
        with open(os.path.join(directory, marker_name(prefix)), "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return None
    if doc.get("v") != VERSION:
        raise SinkOwnedError(f"ownership marker {marker_name(prefix)} of {directory} has version "
                             f"{doc.get('v')!r}, not {VERSION}; this segue cannot write there")
    return doc


def members(doc: dict[str, Any]) -> list[Writer]:
    return [_writer(m) for m in doc.get("members", [])]


def published_parts(directory: str, prefix: str = "", ext: str = "") -> list[str] | None:
    """Names of the published set (sorted), or None when no run claimed the directory.

    ``ext`` narrows to one format (".jsonl"); by default any extension. The
    marker is read before and after listing the directory, and the listing
    repeated if it changed in between, so the set returned is one marker's:
    the old one or the new one across an overwrite, never a mix.
    """
    pat = part_pattern(prefix, ext) if ext else re.compile(
        rf"^{re.escape(prefix)}part-(?:([0-9a-f]{{8}})-)?[A-Za-z0-9.]+-(?:w\d+-)?\d{{8}}\.[A-Za-z0-9]+$")
    doc = read_marker(directory, prefix)
    while doc is not None:
        tags = {w.tag for w in members(doc)}
        adopted = set(doc.get("adopted", []))
        out = sorted(n for n in os.listdir(directory)
                     if (m := pat.match(n)) and (m.group(1) in tags or n in adopted))
        again = read_marker(directory, prefix)
        if again == doc:
            return out
        doc = again
    return None


def unclaimed_parts(directory: str, prefix: str) -> list[str]:
    """Part-like files of ``prefix`` that a directory holds before any run claimed it."""
    pat = re.compile(rf"^{re.escape(prefix)}part-.*$")
    return sorted(n for n in os.listdir(directory) if pat.match(n) and not n.startswith("."))


class Ownership:
    """One writer's view of a directory's marker; every method runs under the directory lock."""

    def __init__(self, directory: str, prefix: str, ext: str, writer: Writer, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.directory, self.prefix, self.ext = directory, prefix, ext
        self.writer, self.mode = writer, mode
        self.path = os.path.join(directory, marker_name(prefix))

    @contextmanager
    def locked(self) -> Iterator[dict[str, Any] | None]:
        """Hold the directory lock; yields the marker (after finishing an interrupted overwrite)."""
        fd = os.open(os.path.join(self.directory, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            doc = read_marker(self.directory, self.prefix)
            if doc is not None and doc.get("retire"):
                doc = self._delete_retired(doc)
            yield doc
        finally:
            os.close(fd)  # closing releases the flock

    def _save(self, doc: dict[str, Any]) -> dict[str, Any]:
        write_atomic(self.path, json.dumps(doc, sort_keys=True).encode())
        return doc

    def _delete_retired(self, doc: dict[str, Any]) -> dict[str, Any]:
        for name in doc["retire"]:
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                pass
        fsync_dir(self.directory)
        return self._save({**doc, "retire": []})

    def _refuse(self, why: str) -> SinkOwnedError:
        where = self.directory + (f" (prefix {self.prefix!r})" if self.prefix else "")
        return SinkOwnedError(f"{where} {why}; write to another directory, or pass mode='append' to add "
                              f"to it or mode='overwrite' to replace it")

    def preflight(self) -> None:
        """The refusals of :meth:`claim_at_open`, read-only (a run being submitted)."""
        if not os.path.isdir(self.directory):
            return
        doc = read_marker(self.directory, self.prefix)
        me = self.writer
        if doc is None:
            found = unclaimed_parts(self.directory, self.prefix)
            if found and self.mode == "new":
                raise self._refuse(f"already holds {len(found)} part files that no segue run claims "
                                   f"(e.g. {found[0]})")
            return
        if me in [_writer(r) for r in doc.get("retired", [])]:
            raise SinkOwnedError(f"the output of {me.describe()} in {self.directory} was replaced by "
                                 f"{self._owner_text(doc)} (mode='overwrite')")
        if me not in members(doc) and self.mode == "new":
            raise self._refuse(f"belongs to {self._owner_text(doc)}")

    def claim_at_open(self) -> bool:
        """Check (and record) this writer's right to the directory; True if it is a member now.

        ``overwrite`` defers the switch to the first publish (:meth:`publish_check`).
        """
        with self.locked() as doc:
            me = self.writer
            if doc is None:
                found = unclaimed_parts(self.directory, self.prefix)
                if found and self.mode == "new":
                    raise self._refuse(f"already holds {len(found)} part files that no segue run "
                                             f"claims (e.g. {found[0]})")
                doc = {"v": VERSION, "prefix": self.prefix, "owner": None, "members": [],
                       "adopted": found, "retired": [], "retire": []}
                if self.mode == "overwrite" and found:
                    self._save(doc)  # the old parts stay visible until the first publish
                    return False
                self._save({**doc, "owner": me.to_json(), "members": [me.to_json()]})
                return True
            if me in [_writer(r) for r in doc.get("retired", [])]:
                raise SinkOwnedError(
                    f"the output of {me.describe()} in {self.directory} was replaced by "
                    f"{self._owner_text(doc)} (mode='overwrite'); this run cannot write there any more")
            if me in members(doc):
                return True
            if self.mode == "new":
                raise self._refuse(f"belongs to {self._owner_text(doc)}")
            if self.mode == "append":
                self._save({**doc, "members": [*doc["members"], me.to_json()]})
                return True
            return False

    @contextmanager
    def publishing(self, *, claim: bool) -> Iterator[None]:
        """Hold the lock around renaming parts into place.

        Before the body: refuse a writer that lost the directory. After it, with
        ``claim`` (parts of this writer are now in place): an ``overwrite``
        writer that is not yet a member replaces the published set in one step.
        """
        with self.locked() as doc:
            self._may_publish(doc)
            yield
            if claim and doc is not None and self.writer not in members(doc):
                self._replace(doc)

    def _may_publish(self, doc: dict[str, Any] | None) -> None:
        me = self.writer
        if doc is not None and me in members(doc):
            return
        if doc is None or self.mode != "overwrite" or me in [_writer(r) for r in doc.get("retired", [])]:
            owner = "no run" if doc is None else self._owner_text(doc)
            raise SinkOwnedError(f"{me.describe()} may no longer publish to {self.directory}: it now "
                                 f"belongs to {owner}; this attempt must stop")

    def _replace(self, doc: dict[str, Any]) -> None:
        me, old = self.writer, members(doc)
        old_tags = {w.tag for w in old}
        pat = part_pattern(self.prefix, self.ext)
        retire = sorted(n for n in os.listdir(self.directory)
                        if (m := pat.match(n)) and m.group(1) in old_tags)
        retire += [n for n in doc.get("adopted", []) if n not in retire]
        fault_point("sink.before_owner_switch")
        # The commit point of the overwrite: one atomic replace of the marker.
        new = self._save({"v": VERSION, "prefix": self.prefix, "owner": me.to_json(),
                          "members": [me.to_json()], "adopted": [],
                          "retired": [*doc.get("retired", []), *[w.to_json() for w in old]],
                          "retire": retire})
        fault_point("sink.after_owner_switch")
        self._delete_retired(new)

    def discard_mine(self, worker_tag: str | None) -> int:
        """Delete every part this writer published (all sub-workers' with ``worker_tag`` None)."""
        tag = self.writer.tag
        w = r"(?:w\d+-)?" if worker_tag is None else re.escape(worker_tag)
        pat = re.compile(rf"^{re.escape(self.prefix)}part-{tag}-[A-Za-z0-9.]+-{w}\d{{8}}{re.escape(self.ext)}$")
        gone = 0
        with self.locked():
            for name in os.listdir(self.directory):
                if pat.match(name):
                    os.unlink(os.path.join(self.directory, name))
                    gone += 1
            if gone:
                fsync_dir(self.directory)
        return gone

    @staticmethod
    def _owner_text(doc: dict[str, Any]) -> str:
        ms = members(doc)
        if not ms:
            return "part files no segue run claims"
        text = ms[0].describe()
        return text if len(ms) == 1 else f"{text} and {len(ms) - 1} appending run(s)"


def unpublished(directory: str) -> set[str]:
    """Part files of ``directory`` outside the published set of any marker in it (for readers).

    A directory no run claimed hides nothing.
    """
    hidden: set[str] = set()
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return hidden
    for name in names:
        if not (name.startswith(".segue-owner") and name.endswith(".json")):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            prefix = str(json.loads(f.read()).get("prefix", ""))
        visible = set(published_parts(directory, prefix) or [])
        hidden.update(n for n in unclaimed_parts(directory, prefix) if n not in visible)
    return hidden
