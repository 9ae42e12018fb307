"""Submit-time checks of a flow's data steps: refuse what their first start would refuse.

A ``@flow.map`` step declares its source and sinks (objects, or builders of
the step context); with the run id and parameters known at submit, ``segue
run`` can build them, list the source's files (a path, directory or glob
that names no file) or probe its broker (a queue source's ``probe``), and
ask each sink whether its output belongs to another run, so the refusal is
exit 2 with nothing written instead of a failed run (or one that "succeeds"
with 0 records). Steps that build them inside the step function are
checked at their start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import DataError, MissingInputError, UsageError


class _SubmitContext:
    """What a sink builder may read at submit: ids and parameters (no store, no epoch yet)."""

    def __init__(self, run_id: str, step: str, params: Mapping[str, Any]) -> None:
        self.run_id, self.step, self.params = run_id, step, dict(params)
        self.epoch = self.attempt = 0


def check_sinks(steps: Mapping[str, Any], run_id: str, params: Mapping[str, Any], *,
                sources: bool = True) -> None:
    """UsageError naming the step if its declared source names no file (``sources``: probed
    on this host's disk), or naming the owning run if a declared sink's output belongs to another run."""
    for name, spec in steps.items():
        decl = getattr(spec.fn, "segue_map", None)
        if decl is None:
            continue
        if sources:
            check_source(decl, run_id, name, params)
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
            except DataError as exc:  # owned by another run, or a table it cannot create
                raise UsageError(f"step {name!r}: {exc}") from None


def declared_source(decl: Any, run_id: str, step: str, params: Mapping[str, Any]) -> Any | None:
    """The source a ``@flow.map`` declaration builds (segue.data.mapstep), or None when
    its builder needs more than ids and parameters (it is checked when the step starts)."""
    from .sources.base import Source

    src = decl.source
    if isinstance(src, Source):
        return src
    try:
        return src(_SubmitContext(run_id, step, params))
    except Exception:  # noqa: BLE001 - a builder that needs a live step context
        return None


def check_source(decl: Any, run_id: str, step: str, params: Mapping[str, Any]) -> None:
    """UsageError if the declared file source's path, directory or glob names no file, or
    if a declared queue source's broker cannot be reached, refuses the login or lacks the queue.

    Listing only, and local paths only: a remote URL could stall ``segue run``
    on the network; its step's first snapshot makes the same check. A queue
    source is probed with one connection (``probe()``), closed again.
    """
    from .sources.files import FileSource, list_files

    src = declared_source(decl, run_id, step, params)
    probe = getattr(src, "probe", None)  # a queue: its broker, credentials and queue
    if probe is not None:
        try:
            probe()
        except (DataError, ConnectionError) as exc:
            raise UsageError(f"step {step!r}: {exc}") from None
        return
    if not isinstance(src, FileSource):
        return
    urls = [src.urls] if isinstance(src.urls, str | os.PathLike) else list(src.urls)
    if not urls or any("://" in os.fspath(u) and not os.fspath(u).startswith("file://") for u in urls):
        return
    try:
        list_files(urls)
    except MissingInputError as exc:
        raise UsageError(f"step {step!r}: {exc}") from None
    except Exception:  # noqa: BLE001 - anything else (a permission): the step's start says why
        return
