"""The host pool's rows: the transaction protocol both backends give, and rows read into records.

Shared by ``store.hostpool`` (the pool) and ``store.hostpool_elastic`` (its
elastic allocations), which the pool builds on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from ..placement.policy import Capacity, Device, Need, device_kind
from .pool import (
    AllocationRecord,
    DeviceRecord,
    HostPool,
    PoolChange,
    PreemptionRequest,
    RequestRecord,
)

_LIVE = "released_at IS NULL AND lease_until > ?"


class Db(Protocol):
    """One transaction of the pool, whichever the backend: ``?`` parameters, rows
    indexed by column name, and the pool's clock read once per transaction."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def now(self) -> float: ...


def kinds(hp: HostPool) -> dict[int, str]:
    """Each device's type, as ``accelerator=`` hints are matched against it."""
    return {d.index: device_kind(d.name, d.memory, d.virtual) for d in hp.devices}


def _host(conn: Db, host: str) -> HostPool | None:
    row = conn.execute("SELECT * FROM pool_hosts WHERE host = ?", (host,)).fetchone()
    if row is None:
        return None
    devs = tuple(
        DeviceRecord(host, d["device"], d["name"], d["memory"], bool(d["virtual"]))
        for d in conn.execute("SELECT * FROM pool_devices WHERE host = ? ORDER BY device", (host,))
    )
    return HostPool(host, row["cpus"], row["memory"], row["source"], devs, row["updated_at"])


def _free(conn: Db, host: str, t: float, home: str | None) -> Capacity:
    """Free devices of the host, and free cpus and memory as seen by ``home``.

    Devices are the machine's: an allocation of any home that holds a device
    whole (no ``gpu_memory``) takes it out; one that shares it takes its bytes,
    and the device stays listed with the memory its sharers leave. CPU
    and memory figures are a share of the host that each home budgets for
    itself (oversubscribing cores only slows runs down, while two holders of
    one GPU break both), so only ``home``'s own allocations count against them
    (every home's when ``home`` is None).
    """
    hp = _host(conn, host)
    if hp is None:
        return Capacity((), 0.0, 0)
    whole: set[int] = set()
    used: dict[int, int] = {}
    sharers: dict[int, int] = {}
    cpus, mem = hp.cpus, hp.memory
    for r in conn.execute(f"SELECT * FROM allocations WHERE host = ? AND {_LIVE}", (host, t)):
        a = _alloc(r)
        for i in a.devices:
            if a.gpu_memory is None:
                whole.add(i)
            else:
                used[i] = used.get(i, 0) + a.gpu_memory
                sharers[i] = sharers.get(i, 0) + 1
        if home is None or a.home == home:
            cpus -= a.cpus
            mem -= a.memory
    kind = kinds(hp)
    devices = tuple(
        Device(d.index, d.memory, free=max(0, d.memory - used.get(d.index, 0)),
               sharers=sharers.get(d.index, 0), kind=kind[d.index])
        for d in hp.devices if d.index not in whole)
    return Capacity(devices, cpus, mem)


def _requests(conn: Db, host: str | None, t: float) -> list[RequestRecord]:
    sql, args = "SELECT * FROM pool_requests WHERE lease_until > ?", list[Any]([t])
    if host is not None:
        sql += " AND host = ?"
        args.append(host)
    sql += " ORDER BY priority DESC, submitted_at ASC"
    return [_request(r) for r in conn.execute(sql, args)]


def _alloc(r: Any) -> AllocationRecord:
    return AllocationRecord(
        id=r["id"], host=r["host"], home=r["home"], run_id=r["run_id"], step=r["step"],
        epoch=r["epoch"], devices=tuple(json.loads(r["devices"])), cpus=r["cpus"],
        memory=r["memory"], priority=r["priority"], preemptible=bool(r["preemptible"]),
        since=r["since"], lease_until=r["lease_until"], released_at=r["released_at"],
        ckpt_at=r["ckpt_at"], preemptions=r["preemptions"], gpu_memory=r["gpu_memory"],
        per_worker=r["per_worker"], min_gpus=r["min_gpus"],
        revoke=tuple(json.loads(r["revoke"])) if r["revoke"] else (), parent=r["parent"],
        accelerator=r["accelerator"],
    )


def _request(r: Any) -> RequestRecord:
    return RequestRecord(
        home=r["home"], run_id=r["run_id"], step=r["step"], host=r["host"],
        priority=r["priority"],
        need=Need(gpus=r["gpus"], gpu_memory=r["gpu_memory"], cpus=r["cpus"], memory=r["memory"],
                  accelerator=r["accelerator"]),
        submitted_at=r["submitted_at"], reason=r["reason"], lease_until=r["lease_until"],
    )


def _pool_change(r: Any) -> PoolChange:
    return PoolChange(id=r["id"], time=r["time"], host=r["host"], actor=r["actor"], user=r["user"],
                      change=json.loads(r["change"]))


def _preemption(r: Any) -> PreemptionRequest:
    return PreemptionRequest(
        id=r["id"], home=r["home"], run_id=r["run_id"], by_home=r["by_home"], by_run=r["by_run"],
        reason=r["reason"], created_at=r["created_at"], lease_until=r["lease_until"],
        outcome=r["outcome"],
        devices=None if r["devices"] is None else tuple(json.loads(r["devices"])),
    )
