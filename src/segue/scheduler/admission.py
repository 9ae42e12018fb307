"""Admission: refuse at submit a run that can never be placed on this host (on a
cluster-wide pool: on any host of the cluster).

A run whose step needs more GPUs (or bigger ones) than the host pool has would
otherwise wait in RUNNING for ever. Only GPU needs are checked: CPU and memory
figures of a step are a share of the host, not a hard floor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..errors import UsageError
from ..flow.model import StepSpec
from ..hostname import this_host
from ..placement.policy import step_need
from ..store.hostpool import never_fits
from ..store.pool import HostPoolStore
from ..store.pools import open_pool
from .devices import ensure_host


def check_satisfiable(
    steps: Mapping[str, StepSpec], order: Sequence[str], *, gpus: int = -1, gpu_memory: int = 0,
    pool: Callable[[], HostPoolStore] = open_pool, host: str | None = None,
) -> None:
    """Raise UsageError naming the step, its need and the host's capacity if it can never fit."""
    needs = {s: step_need(steps, s, gpus, gpu_memory) for s in order}
    if not any(n.gpus for n in needs.values()):
        return  # CPU-only runs never need the pool at submit
    opened = pool()  # opened only for a GPU run
    hp = ensure_host(opened, host or this_host())
    # A cluster-wide pool: the run may go on on any host of the cluster.
    others = opened.list_hosts() if opened.cluster else []
    for step, need in needs.items():
        why = never_fits(need, hp)
        if why is None or any(never_fits(need, o) is None for o in others):
            continue
        fix = ("no GPU driver was found; on a machine without GPUs add virtual ones with "
               "`segue pool set --gpus N`" if hp.source == "none" and not hp.devices
               else "add devices with `segue pool set --gpus N` or ask for fewer with --gpus")
        raise UsageError(f"step {step!r} {why}; {fix}")
