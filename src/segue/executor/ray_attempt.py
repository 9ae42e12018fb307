"""What a worker on Ray learns from the actor that started it (``RayAttempt``).

The attempt's actor (executor.ray_node) adds it to the options record the
controller handed the worker (segue.run.worker_options), under ``"ray"``; the
worker's members (sub-workers, ranks) then become actors of the same cluster
(executor.ray_pool). A value type with its JSON form: it crosses a pipe, never
the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RayAttempt:
    address: str  # the cluster's GCS address: where the worker's members are placed
    node_id: str  # the Ray node the worker runs on
    flow_file: str  # the flow file as placed on this node (its source travels by content)
    gpus: tuple[int, ...] = ()  # the GPUs Ray gave the attempt's actor (its CUDA_VISIBLE_DEVICES)
    warm: tuple[str, ...] = ()  # the names of the sub-worker actors warmed with the attempt

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "node_id": self.node_id, "flow_file": self.flow_file,
                "gpus": list(self.gpus), "warm": list(self.warm)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RayAttempt:
        return cls(address=str(doc["address"]), node_id=str(doc["node_id"]),
                   flow_file=str(doc["flow_file"]), gpus=tuple(int(g) for g in doc.get("gpus", ())),
                   warm=tuple(str(n) for n in doc.get("warm", ())))
