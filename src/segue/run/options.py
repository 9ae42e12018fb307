"""Per-run options, stored with the run so every controller applies the same ones."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import UsageError
from ..placement.policy import MAX_PRIORITY

# Options whose value is one of a few words (the others are numbers or booleans).
_CHOICES: dict[str, tuple[str, ...]] = {"on_input_change": ("fail", "pin", "include-new"),
                                        "on_env_change": ("fail", "warn", "allow"),
                                        "executor": ("local", "ray")}
# Options whose value is free text (a path, a URL, an address).
_TEXT = ("checkpoints", "ray_address")
# Bounds that keep a value storable (64-bit columns) and meaningful.
_LIMITS: dict[str, int] = {"priority": MAX_PRIORITY, "gpus": 1024}


@dataclass(frozen=True)
class RunOptions:
    pause_deadline_s: float = 30.0  # cooperative pause; past it the attempt is killed
    pause_on_failure: bool = False  # retries exhausted -> PAUSED instead of FAILED
    lease_ttl_s: float = 10.0  # worker and controller leases
    backoff_base_s: float = 0.25  # retry n waits base * 2**(n-1), capped
    backoff_max_s: float = 30.0
    max_parallel_cpus: float = 0.0  # 0: this machine's CPU count
    # Scheduling (see segue.scheduler): priority class value, preemptibility
    # (None: by class), aging period for preempted runs, and GPU overrides.
    priority: int = 100
    preemptible: bool | None = None
    max_pause_s: float = 0.0
    gpus: int = -1  # -1: as the steps declare
    gpu_memory: int = 0  # bytes per GPU; 0: as the steps declare
    # Data steps: what a restore does when the input changed since the run
    # began (segue.data.pinning). Stored with the run like every option, so a
    # worker started by any controller (a resume, an auto-resume after
    # preemption) applies the policy the operator chose.
    on_input_change: str = "fail"
    # What a resume does when a distribution a step imported, or a variable the flow
    # declares, changed since the run last ran (segue.run.environment).
    on_env_change: str = "fail"
    # Where the run's checkpoints and step outputs live: "" for the home's data
    # directory, an absolute path, or any fsspec URL (s3://bucket/prefix, gs://...),
    # so that every host of a cluster reads the same ones (segue.home.storage_at).
    checkpoints: str = ""
    # How attempts run: "local" child processes, or actors on a Ray cluster
    # (segue.executor.ray) at ray_address ("": $RAY_ADDRESS, else a local Ray).
    executor: str = "local"
    ray_address: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _TEXT:
                if not isinstance(v, str) or len(v) > 4096:
                    raise UsageError(f"run option {f.name} must be a path or URL, not {v!r}")
                continue
            if f.name in _CHOICES:
                if v not in _CHOICES[f.name]:
                    raise UsageError(f"run option {f.name} must be one of {', '.join(_CHOICES[f.name])}, "
                                     f"not {v!r}")
                continue
            if f.name in ("pause_on_failure", "preemptible"):
                if not (isinstance(v, bool) or (v is None and f.name == "preemptible")):
                    raise UsageError(f"run option {f.name} must be true or false, not {v!r}")
                continue
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise UsageError(f"run option {f.name} must be a number, not {v!r}")
            if not math.isfinite(v):  # nan passes every comparison below
                raise UsageError(f"run option {f.name} must be a finite number, not {v!r}")
            if v < 0 and f.name not in ("priority", "gpus"):
                raise UsageError(f"run option {f.name} must be non-negative, not {v!r}")
            if abs(v) > _LIMITS.get(f.name, 2**63 - 1):
                raise UsageError(f"run option {f.name} must be at most {_LIMITS.get(f.name, 2**63 - 1)} "
                                 f"in size, not {v!r}")
        if self.lease_ttl_s < 0.5:
            raise UsageError("run option lease_ttl_s must be at least 0.5 seconds")

    @property
    def is_preemptible(self) -> bool:
        from ..placement.policy import default_preemptible

        return default_preemptible(self.priority) if self.preemptible is None else self.preemptible

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOptions:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_env(cls, **overrides: Any) -> RunOptions:
        """Defaults, then ``SEGUE_<OPTION>`` variables (e.g. SEGUE_LEASE_TTL_S), then overrides."""
        base: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(f"SEGUE_{f.name.upper()}")
            if raw is None:
                continue
            if f.name in ("pause_on_failure", "preemptible"):
                base[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
                continue
            if f.name in _CHOICES or f.name in _TEXT:
                base[f.name] = raw.strip()
                continue
            try:
                num = float(raw)
            except ValueError:
                raise UsageError(f"SEGUE_{f.name.upper()}={raw!r} must be a number") from None
            base[f.name] = int(num) if f.name in ("priority", "gpus", "gpu_memory") else num
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def with_changes(self, **changes: Any) -> RunOptions:
        """A copy with ``changes`` applied (None values ignored), validated like a new one."""
        return RunOptions.from_json({**self.to_json(), **{k: v for k, v in changes.items() if v is not None}})

    def backoff(self, failures: int) -> float:
        return min(self.backoff_max_s, self.backoff_base_s * (2 ** max(0, failures - 1)))
