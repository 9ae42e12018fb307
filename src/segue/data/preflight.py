"""Submit-time checks of a flow's data steps: refuse what their first start would refuse.

A ``@flow.map`` step declares its sinks (objects, or builders of the step
context); with the run id and parameters known at submit, ``segue run`` can
build them and ask each whether its output belongs to another run, so the
refusal is exit 2 with nothing written instead of a failed run. Steps that
build their sinks inside the step function are checked at their start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SinkOwnedError, UsageError


class _SubmitContext:
    """What a sink builder may read at submit: ids and parameters (no store, no epoch yet)."""

    def __init__(self, run_id: str, step: str, params: Mapping[str, Any]) -> None:
        self.run_id, self.step, self.params = run_id, step, dict(params)
        self.epoch = self.attempt = 0


def check_sinks(steps: Mapping[str, Any], run_id: str, params: Mapping[str, Any]) -> None:
    """UsageError naming the owning run if a declared sink's output belongs to another run."""
    for name, spec in steps.items():
        decl = getattr(spec.fn, "segue_map", None)
        if decl is None:
            continue
        ctx = _SubmitContext(run_id, name, params)
        for sink in (decl.sink, decl.dead_letter):
            if sink is None:
                continue
            try:
                obj = sink if hasattr(sink, "preflight") else sink(ctx)
            except Exception:  # noqa: BLE001 - a builder that needs more than ids and params
                continue  # checked when the step starts
            try:
                obj.preflight(run_id, name)
            except SinkOwnedError as exc:
                raise UsageError(f"step {name!r}: {exc}") from None
