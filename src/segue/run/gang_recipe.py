"""What a gang's coordinator and its ranks share: the rank's recipe, shard paths, manifest digests.

Apart from ``run.gang`` (the coordinator, which starts the ranks) so a rank
(``run.gang_rank``) imports it without importing the coordinator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .. import checkpoint as ckpt
from ..checkpoint.format import MANIFEST_NAME
from ..errors import SegueError


class GangAborted(SegueError):
    """A checkpoint of the gang was aborted (a vote did not come): retried from the last commit."""

    segue_retryable = True


@dataclass(frozen=True)
class RankRecipe:
    """What a rank process needs to run its copy of the step."""

    home: str
    run_id: str
    step: str
    epoch: int
    world_size: int
    master_port: int  # torch.distributed's rendezvous at master_addr
    distributed: str | None
    master_addr: str = "127.0.0.1"  # on Ray: rank 0's node (executor.ray_pool sets it)
    # The flow file the worker loaded; on Ray, the copy placed on the rank's node
    # (executor.ray_member sets it). "": the run's own.
    flow_path: str = ""
    # The home's store as the worker was told it (None: the home's own choice); not in
    # the repr, a URL may hold a password.
    store: str | None = field(default=None, repr=False)


def shard_path(path: str, rank: int) -> str:
    return f"{path}/rank-{rank}"


def manifest_digest(storage: ckpt.CheckpointStorage, path: str) -> tuple[str, int]:
    """The SHA-256 and size of a checkpoint's manifest, read once."""
    raw = storage.read_bytes(f"{path}/{MANIFEST_NAME}")
    return hashlib.sha256(raw).hexdigest(), len(raw)
