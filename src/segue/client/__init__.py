"""The library API: ``segue.Client`` drives runs from Python, over a home or a server.

    from segue import Client

    c = Client()                                   # the home ./.segue (or $SEGUE_HOME)
    c = Client("/data/segue-home")                 # another home
    c = Client("http://127.0.0.1:8765", token=t)   # a `segue server`

    run = c.submit("flows/nightly.py", {"n": 1000}, priority="batch")
    c.pause(run.run_id, wait=True, timeout=60)
    c.resume(run.run_id)
    c.wait(run.run_id, ["SUCCEEDED"])
    print(c.output(run.run_id, "report"))

Both kinds pass the same contract tests (tests/client/test_contract.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .base import FINISHED, RESTING, BaseClient
from .records import (
    CheckpointRecord,
    DeviceView,
    Event,
    MetricPoint,
    PoolChange,
    PoolView,
    QueueEntry,
    RunStatus,
    RunSummary,
    StepStatus,
)

if TYPE_CHECKING:
    from .http import HttpClient as HttpClient
    from .local import LocalClient as LocalClient

__all__ = [
    "FINISHED", "RESTING", "BaseClient", "CheckpointRecord", "Client", "DeviceView", "Event", "MetricPoint",
    "PoolChange", "PoolView", "QueueEntry", "RunStatus", "RunSummary", "StepStatus",
]


def Client(target: str | os.PathLike[str] | None = None, *, token: str | None = None,  # noqa: N802
           pool: str | os.PathLike[str] | None = None, store: str | None = None) -> BaseClient:
    """A client for ``target``: a home directory (default ``$SEGUE_HOME`` or
    ``./.segue``) or the URL of a `segue server` (``http://127.0.0.1:8765``,
    with ``token``). ``pool``: the host pool a home's controllers use; ``store``:
    the home's metadata store, a ``postgresql://`` URL (homes only)."""
    if isinstance(target, str) and target.startswith(("http://", "https://")):
        from .http import HttpClient

        if pool is not None or store is not None:
            from ..errors import UsageError

            raise UsageError(f"{'pool' if pool is not None else 'store'}= applies to a home; "
                             f"a server uses its own")
        return HttpClient(target, token)
    from .local import LocalClient

    if token is not None:
        from ..errors import UsageError

        raise UsageError("token= applies to a server URL (http://...); a home needs none")
    return LocalClient(target, store=store, pool=pool)


def __getattr__(name: str) -> object:  # LocalClient and HttpClient, imported when first asked for
    if name == "LocalClient":
        from .local import LocalClient

        return LocalClient
    if name == "HttpClient":
        from .http import HttpClient

        return HttpClient
    raise AttributeError(name)
