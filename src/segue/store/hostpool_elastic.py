"""Resizing an elastic map step's allocation in the host pool (mixed into SqlHostPool).

An elastic step (``@flow.map(..., workers=(min, max), gpus=G)``) is placed with
the devices of its ``min`` sub-workers and then changes size while it runs:

* it **grows** by whole sub-worker groups of ``G`` devices when devices are
  free and nobody else waits for them (:meth:`grow`, called by the step's
  coordinator when it has a backlog);
* a preemptor that needs fewer devices than the run holds asks for **some of
  them** (a partial preemption request); the victim's controller promises them
  (:meth:`revoke`), and the coordinator stops the sub-workers on them at its
  next checkpoint barrier and gives them back (:meth:`shrink`); the run never
  pauses. It also shrinks by itself when a sub-worker has nothing left to do.

Every resize closes the allocation's row and opens a new one (``parent`` names
the old one) in the same transaction, so the pool's history still shows each
device's holders over time, and accounting integrates device-seconds over the
rows (:meth:`allocation_history`). Resizes are fenced like renewals: only the
live row of the attempt's epoch changes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..placement.policy import Need, place
from .hostpool_rows import _LIVE, _alloc, _free, _requests
from .pool import AllocationRecord

_KEY = "home = ? AND run_id = ? AND step = ? AND epoch = ?"


class ElasticPoolMixin:
    _write: Any  # provided by SqlHostPool
    _read: Any

    def allocation(self, home: str, run_id: str, step: str, epoch: int) -> AllocationRecord | None:
        return self._read(lambda db: _live(db, (home, run_id, step, epoch), db.now()))  # type: ignore[no-any-return]

    def grow(self, home: str, run_id: str, step: str, epoch: int, *, gpus: int,
             max_gpus: int) -> tuple[int, ...]:

        def body(db: Any) -> tuple[int, ...]:
            t = db.now()
            a = _live(db, (home, run_id, step, epoch), t)
            if a is None or not a.elastic:
                return ()
            g = int(a.per_worker or 1)
            want = min(gpus, max_gpus - len(a.devices)) // g * g
            if want <= 0:
                return ()
            for r in _requests(db, a.host, t):
                if (r.home, r.run_id) != (home, run_id) and r.need.gpus:
                    return ()  # growth never takes what a waiting run could use
            free = _free(db, a.host, t, home)
            while want > 0:
                devs = place(Need(gpus=want, gpu_memory=a.gpu_memory, accelerator=a.accelerator),
                             free)
                if devs is not None:
                    _resize(db, a, a.devices + tuple(devs), a.revoke, t)
                    return tuple(devs)
                want -= g
            return ()

        return self._write(body)  # type: ignore[no-any-return]

    def shrink(self, home: str, run_id: str, step: str, epoch: int,
               devices: Sequence[int]) -> AllocationRecord | None:
        def body(db: Any) -> AllocationRecord | None:
            t = db.now()
            a = _live(db, (home, run_id, step, epoch), t)
            if a is None:
                return None
            gone = {int(d) for d in devices}
            keep = tuple(d for d in a.devices if d not in gone)
            if keep == a.devices:
                return a
            return _resize(db, a, keep, tuple(d for d in a.revoke if d not in gone), t)

        return self._write(body)  # type: ignore[no-any-return]

    def revoke(self, home: str, run_id: str, devices: Sequence[int]) -> bool:
        promised = {int(d) for d in devices}

        def body(db: Any) -> bool:
            t = db.now()
            hit = False
            for r in db.execute(f"SELECT * FROM allocations WHERE home = ? AND run_id = ?"
                                f" AND {_LIVE}", (home, run_id, t)).fetchall():
                a = _alloc(r)
                mine = promised.intersection(a.devices)
                if a.elastic and mine:
                    db.execute("UPDATE allocations SET revoke = ? WHERE id = ?",
                               (json.dumps(sorted(set(a.revoke) | mine)), a.id))
                    hit = True
            return hit

        return self._write(body)  # type: ignore[no-any-return]

    def allocation_history(self, alloc_id: int) -> list[AllocationRecord]:
        def body(db: Any) -> list[AllocationRecord]:
            out: list[AllocationRecord] = []
            next_id: int | None = alloc_id
            while next_id is not None and len(out) < 100_000:
                row = db.execute("SELECT * FROM allocations WHERE id = ?", (next_id,)).fetchone()
                if row is None:
                    break
                a = _alloc(row)
                out.append(a)
                next_id = a.parent
            return list(reversed(out))

        return self._read(body)  # type: ignore[no-any-return]


def _live(db: Any, key: tuple[str, str, str, int], t: float) -> AllocationRecord | None:
    row = db.execute(f"SELECT * FROM allocations WHERE {_KEY} AND {_LIVE}",
                     (*key, t)).fetchone()
    return None if row is None else _alloc(row)


def _resize(db: Any, a: AllocationRecord, devices: tuple[int, ...],
            revoke: tuple[int, ...], t: float) -> AllocationRecord:
    """Close ``a`` and open its successor holding ``devices``; one transaction (the caller's)."""
    # The closed row gives up the (home, run, step, epoch) key, keeping its history
    # under a negative epoch, as bind does for dead rows.
    db.execute("UPDATE allocations SET released_at = ?, epoch = -id WHERE id = ?", (t, a.id))
    row = db.execute(
        "INSERT INTO allocations (host, home, run_id, step, epoch, devices, cpus, memory, priority,"
        " preemptible, since, lease_until, ckpt_at, preemptions, gpu_memory, per_worker, min_gpus,"
        " revoke, parent, accelerator) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
        " ?, ?, ?) RETURNING *",
        (a.host, a.home, a.run_id, a.step, a.epoch, json.dumps(list(devices)), a.cpus, a.memory,
         a.priority, int(a.preemptible), t, a.lease_until, a.ckpt_at, a.preemptions, a.gpu_memory,
         a.per_worker, a.min_gpus, json.dumps(list(revoke)) if revoke else None, a.id,
         a.accelerator)).fetchone()
    return _alloc(row)
