"""Accounting of one attempt: what it held, what of that was lost, what resuming saved.

Figures are resource-seconds per device *type* (a catalog key of
``scheduler.pricing``; ``cpu`` counts core-seconds) kept in the store's
per-run counters, so money is computed at display time from the current
prices. The definitions, and why they add up, are in docs/accounting.md:

- held = useful + redone, per attempt and so per run;
- redone: what a killed or failed attempt did after its last checkpoint;
- saved by resuming: at each resume, the work of the step that its restored
  checkpoint covers (what a restart from zero would redo), credited once the
  next attempt of the step has started, never more than the step's useful work.

This module computes counter deltas only; it never writes to the store.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..placement.pricing import CPU, UNKNOWN_GPU, device_type
from ..store.pool import AllocationRecord, HostPool

Rates = dict[str, float]  # type -> devices (or cores) held


def rates_of(alloc: AllocationRecord | None, host: HostPool | None) -> Rates:
    """What an allocation holds, per type: whole devices count 1, a device shared by
    memory counts the step's ``gpu_memory`` over the device's memory."""
    out: Rates = {}
    if alloc is None:
        return out
    devs = {d.index: d for d in host.devices} if host else {}
    for i in alloc.devices:
        d = devs.get(i)
        key = device_type(d.name, d.memory, d.virtual) if d else UNKNOWN_GPU
        # A step sharing a device by memory holds (and pays for) its share of it.
        share = 1.0
        if alloc.gpu_memory and d is not None and d.memory:
            share = min(1.0, alloc.gpu_memory / d.memory)
        out[key] = out.get(key, 0.0) + share
    if alloc.cpus:
        out[CPU] = out.get(CPU, 0.0) + alloc.cpus
    return out


def mean_rates(history: list[AllocationRecord], host: HostPool | None, end: float) -> Rates:
    """What a resized allocation held on average over its rows (oldest first): each
    row's rates weighted by how long it lasted, so device-seconds add up."""
    if not history:
        return {}
    total = max(1e-9, end - history[0].since)
    out: Rates = {}
    for row in history:
        until = row.released_at if row.released_at is not None else end
        w = max(0.0, min(until, end) - row.since) / total
        for k, n in rates_of(row, host).items():
            out[k] = out.get(k, 0.0) + n * w
    return out


def gpus_of(rates: Mapping[str, float]) -> float:
    return sum(n for k, n in rates.items() if k != CPU)


def _key(step: str, name: str) -> str:
    return f"step:{step}:{name}"


def pending_saving(stats: Mapping[str, float], step: str) -> tuple[int, float, Rates]:
    """(epoch of the interrupted attempt, wall seconds, resource-seconds per type) that
    the step's restored checkpoint covers, not yet credited (epoch 0: none)."""
    epoch = int(stats.get(_key(step, "pending_epoch"), 0))
    prefix = _key(step, "pending:")
    per_type = {k[len(prefix):]: v for k, v in stats.items() if k.startswith(prefix) and v}
    return epoch, stats.get(_key(step, "pending_s"), 0.0), per_type


def attempt_deltas(
    stats: Mapping[str, float], step: str, epoch: int, rates: Mapping[str, float], *,
    dur: float, lost: float, interrupted: bool,
) -> tuple[dict[str, float], dict[str, float]]:
    """Counter changes for an attempt that ended: (deltas to add, values to set).

    ``lost``: seconds of this attempt after its last checkpoint, when it was
    killed or failed (0 when it completed or parked at a checkpoint).
    ``interrupted``: the step did not complete; its next attempt resumes.
    """
    lost = min(max(0.0, lost), dur)
    gpus = gpus_of(rates)
    add: dict[str, float] = {
        "attempt_s": dur, "device_s": gpus * dur, _key(step, "s"): dur,
        "work_redone_s": lost, "device_s_redone": gpus * lost, _key(step, "lost"): lost,
        _key(step, "useful_s"): dur - lost,
    }
    for k, n in rates.items():
        add[f"held:{k}"] = n * dur
        add[f"redone:{k}"] = n * lost
        add[f"useful:{k}"] = n * (dur - lost)
        add[_key(step, f"useful:{k}")] = n * (dur - lost)
    put: dict[str, float] = {}
    p_epoch, p_s, p_types = pending_saving(stats, step)
    if p_epoch and p_epoch < epoch:
        # This attempt resumed the one interrupted at p_epoch: credit that saving now, once.
        add["resumes"] = 1.0
        add["saved_s"] = p_s
        add["device_s_saved"] = gpus_of(p_types)
        for k, v in p_types.items():
            add[f"saved:{k}"] = v
    if p_epoch and p_epoch < epoch or interrupted:
        put[_key(step, "pending_epoch")] = 0.0
        put[_key(step, "pending_s")] = 0.0
        put.update({_key(step, f"pending:{k}"): 0.0 for k in p_types})
    if interrupted:
        # What the next attempt will not redo: everything useful this step did so far.
        prefix = _key(step, "useful:")
        useful = {k[len(prefix):]: v for k, v in stats.items() if k.startswith(prefix)}
        for k, n in rates.items():
            useful[k] = useful.get(k, 0.0) + n * (dur - lost)
        put[_key(step, "pending_epoch")] = float(epoch)
        put[_key(step, "pending_s")] = stats.get(_key(step, "useful_s"), 0.0) + dur - lost
        put.update({_key(step, f"pending:{k}"): v for k, v in useful.items()})
    return add, put
