"""The accounting part of `segue status`: time, devices, checkpoint storage and money.

Every figure is defined in docs/accounting.md. The counters come from the
store (``scheduler.accounting`` writes them when an attempt ends); the attempts
running now are added from their live allocations, as useful work so far.
Money is computed here, from resource-seconds per device type and the
current prices, so ``cost = resource-hours x price`` holds exactly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._procs import controller_alive
from ..placement.pricing import CPU, HOURS_PER_MONTH, UNKNOWN_GPU, Prices
from ..scheduler.accounting import gpus_of, pending_saving, rates_of
from ..states import TaskState
from ..store.base import Store, TaskRecord
from .recovery import attempt_start, last_alive


def _per_type(stats: Mapping[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix):]: v for k, v in stats.items() if k.startswith(prefix) and v}


def _add(into: dict[str, float], more: Mapping[str, float]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v


def _in_flight(store: Store, pool: Any, home_key: str | None, run_id: str,
               now: float, tasks: Sequence[TaskRecord]) -> tuple[float, dict[str, float]]:
    """Wall seconds and resource-seconds per type of the attempts running now.

    ``pool``: where allocations and hosts live (the store itself while it holds
    the pool); ``home_key``: this home's name in a pool shared by several homes.
    An attempt of a run that nothing drives (its controller died) ended, unseen,
    at its last heartbeat: it is counted that far, as its reclaim will charge it.
    """
    running = {t.step: t for t in tasks if t.state == TaskState.RUNNING}
    if not running or pool is None:
        return 0.0, {}
    driven = controller_alive(store.get_run(run_id), store.now())
    wall, held = 0.0, dict[str, float]()
    # Undriven, its lease may have lapsed: look past the live allocations (rarely needed).
    for a in pool.list_allocations(None, live_only=driven):
        t = running.get(a.step)
        if a.run_id != run_id or t is None or t.epoch != a.epoch or a.released_at is not None:
            continue
        if home_key is not None and getattr(a, "home", home_key) != home_key:
            continue  # the same run id in another home
        if driven:
            dur = max(0.0, now - a.since)
        else:
            start = attempt_start(store, run_id, t.step, t.epoch)
            dur = max(0.0, last_alive(t) - (a.since if start is None else start))
        wall += dur
        _add(held, {k: n * dur for k, n in rates_of(a, pool.get_host(a.host)).items()})
    return wall, held


def _saved(tasks: Sequence[TaskRecord], stats: Mapping[str, float]) -> tuple[float, float, dict[str, float]]:
    """(resumes, wall seconds, resource-seconds per type) saved by resuming, including a
    resume whose attempt is still running (credited to the counters when it ends)."""
    resumes = stats.get("resumes", 0.0)
    wall = stats.get("saved_s", 0.0)
    per_type = _per_type(stats, "saved:")
    for t in tasks:
        if f"step:{t.step}:pending_epoch" not in stats:  # (pending_saving's key) most tasks: none
            continue
        epoch, s, types = pending_saving(stats, t.step)
        if epoch and t.epoch > epoch:
            resumes, wall = resumes + 1, wall + s
            _add(per_type, types)
    return resumes, wall, per_type


def _usd(x: float) -> float:
    return round(x, 4)


def accounting(store: Store, run_id: str, prices: Prices | None = None, *,
               now: float | None = None, pool: Any = None,
               home_key: str | None = None, tasks: Sequence[TaskRecord] | None = None) -> dict[str, Any]:
    """``tasks``: the run's, read already by the caller (a fan-out has thousands)."""
    tasks = store.get_tasks(run_id) if tasks is None else tasks

    prices = prices or Prices.resolve()
    now = time.time() if now is None else now
    stats: dict[str, float] = getattr(store, "get_stats", lambda r: {})(run_id)
    held, redone = _per_type(stats, "held:"), _per_type(stats, "redone:")
    if not held and stats.get("device_s"):
        held = {UNKNOWN_GPU: stats["device_s"]}  # counted before device types were recorded
        redone = {UNKNOWN_GPU: stats.get("device_s_redone", 0.0)}
    if pool is None and hasattr(store, "list_allocations"):
        pool = store
    live_s, live = _in_flight(store, pool, home_key, run_id, now, tasks)
    _add(held, live)
    useful = {k: v - redone.get(k, 0.0) for k, v in held.items()}
    resumes, saved_s, saved = _saved(tasks, stats)

    cks = store.list_checkpoints(run_id, statuses=("committed", "quarantined", "pruned"))
    stored = [c for c in cks if c.status != "pruned"]
    stored_bytes = sum(c.nbytes for c in stored)
    # Accrued storage of what is still stored; pruned checkpoints are left out (lower bound).
    gb_months = sum(c.nbytes / 1e9 * max(0.0, now - c.created_at) / 3600 / HOURS_PER_MONTH
                    for c in stored)
    storage_price = prices.storage_per_month(10**9)
    device_s, device_redone = gpus_of(held), gpus_of(redone)
    types = sorted(set(held) | set(saved))
    return {
        "attempt_seconds": round(stats.get("attempt_s", 0.0) + live_s, 3),
        "device_seconds": round(device_s, 3),
        "device_seconds_useful": round(device_s - device_redone, 3),
        "device_seconds_redone": round(device_redone, 3),
        "cpu_core_seconds": round(held.get(CPU, 0.0), 3),
        "cpu_core_seconds_redone": round(redone.get(CPU, 0.0), 3),
        "work_redone_seconds": round(stats.get("work_redone_s", 0.0), 3),
        "resumes": int(resumes),
        "seconds_saved_by_resume": round(saved_s, 3),
        "device_seconds_saved_by_resume": round(gpus_of(saved), 3),
        "paused_seconds": round(paused_seconds(store, run_id, now), 3),
        "checkpoint_bytes": sum(c.nbytes for c in cks),
        "checkpoint_bytes_stored": stored_bytes,
        "preemptions": int(stats.get("preemptions", 0)),
        # Elastic map steps: devices given to a more urgent run without pausing, and resizes.
        "partial_preemptions": int(stats.get("preemptions_partial", 0)),
        "scale_ups": int(stats.get("scale_ups", 0)),
        "scale_downs": int(stats.get("scale_downs", 0)),
        # Models loaded by inference steps; a reload is a load in an attempt after the first.
        "model_loads": int(stats.get("model_loads", 0)),
        "model_load_seconds": round(stats.get("model_load_s", 0.0), 3),
        "model_reloads": int(stats.get("model_reloads", 0)),
        "model_reload_seconds": round(stats.get("model_reload_s", 0.0), 3),
        "model_reload_bytes": int(stats.get("model_reload_bytes", 0)),
        "waiting_for_resources": stats.get("preempted_at", 0.0) > 0,
        "by_type": {k: {
            "seconds": round(held.get(k, 0.0), 3),
            "redone_seconds": round(redone.get(k, 0.0), 3),
            "saved_seconds": round(saved.get(k, 0.0), 3),
            "usd_per_hour": prices.per_hour(k),
        } for k in types},
        "cost": {
            "currency": "USD",
            "so_far": _usd(prices.cost(held)),
            "useful": _usd(prices.cost(useful)),
            "redone": _usd(prices.cost(redone)),
            "avoided_by_resume": _usd(prices.cost(saved)),
            "storage_so_far": _usd(gb_months * storage_price),
            "storage_per_month": _usd(stored_bytes / 1e9 * storage_price),
            "storage_usd_per_gb_month": storage_price,
        },
    }


def paused_seconds(store: Store, run_id: str, until: float | None = None) -> float:
    """Time the run spent PAUSED (or PAUSING), from its event log."""
    total, since = 0.0, None
    for e in store.list_events(run_id, kinds=("run",)):
        if e.to_state is None:
            continue
        if e.to_state in ("PAUSING", "PAUSED") and since is None:
            since = e.time
        elif e.to_state not in ("PAUSING", "PAUSED") and since is not None:
            total += e.time - since
            since = None
    if since is not None:
        total += (until or time.time()) - since
    return total
