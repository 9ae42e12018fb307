"""The host registry's rules, shared by both backends: judging a registration,
fencing a renewal, and turning a row into a :class:`HostRecord`."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ControllerConflictError, FencedError
from .base import HostRecord
from .transitions import fmt_time


def check_register(host: str, row: Any, t: float, steal: bool) -> int:
    """The new agent epoch for ``host``, or a refusal while its agent lives."""
    if row is None:
        return 1
    if not steal and row["lease_until"] is not None and row["lease_until"] > t:
        raise ControllerConflictError(
            f"host {host!r} already has a live agent (pid {row['pid']}, lease until "
            f"{fmt_time(row['lease_until'])}); stop it first, or give this one another --host-id")
    return int(row["epoch"]) + 1


def check_renew(host: str, row: Any, epoch: int) -> None:
    cur = None if row is None else int(row["epoch"])
    if cur != epoch:
        raise FencedError(f"agent epoch {epoch} of host {host!r} was superseded by epoch {cur}; "
                          "this agent must stop")


def host_record(r: Any) -> HostRecord:
    return HostRecord(host=r["host"], epoch=int(r["epoch"]), pid=r["pid"], info=json.loads(r["info"]),
                      started_at=float(r["started_at"]), seen_at=float(r["seen_at"]),
                      lease_until=None if r["lease_until"] is None else float(r["lease_until"]))
