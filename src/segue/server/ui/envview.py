"""The run page's Environment section: the environment the run recorded and the diff to
the server's environment now (segue.run.environment; the same as `segue env RUN`)."""

from __future__ import annotations

from typing import Any

from ... import errors
from ...client.local import LocalClient
from ...run.environment import describe


def environment_view(client: LocalClient, run_id: str) -> dict[str, Any] | None:
    """What the section shows; None where nothing can be said (the page shows the rest)."""
    try:
        doc = client.environment(run_id)
    except (errors.SegueError, OSError):
        return None
    rec = doc["recorded"]
    return {"recorded": rec is not None, "recorded_at": doc["recorded_at"], "recorded_time": doc["recorded_time"],
            "policy": doc["policy"], "lines": describe(rec, doc["imported"]) if rec else [],
            "changes": doc["changes"], "would_refuse": doc["would_refuse"]}
