"""segue.checkpoint in a plain torch training loop, outside any flow.

Trains a small model in a child process that is SIGKILLed midway, resumes from the
last durable checkpoint, and checks the result equals an uninterrupted run bit for
bit (model, optimizer with its step counters, and the RNG all come back).

    python examples/standalone_torch.py [DIR]      # DIR may be any fsspec URL
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import torch

from segue.checkpoint import CheckpointManager

STEPS = 60


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(where: str | None, crash_at: int | None = None) -> dict[str, torch.Tensor]:
    model, opt = build()
    start = 0
    mgr = CheckpointManager(where, keep_last=2, every_steps=10) if where else None
    if mgr is not None and (latest := mgr.restore_latest()) is not None:
        start, state = latest
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])
        print(f"resumed at step {start}")
    for step in range(start, STEPS):
        if crash_at is not None and step == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, like a lost node
        x = torch.randn(32, 16)
        loss = (model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mgr is not None and mgr.due(step + 1):
            state = {"model": model.state_dict(), "opt": opt.state_dict(),
                     "rng": torch.get_rng_state()}
            mgr.save(step + 1, state)  # returns after the copy; written in the background
    if mgr is not None:
        mgr.close()  # waits until the last checkpoint is durable
    return model.state_dict()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        train(sys.argv[2], crash_at=int(sys.argv[3]))
        return 0
    where = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="segue-example-")
    child = subprocess.run([sys.executable, __file__, "--child", where, "37"])
    print(f"training process killed (exit {child.returncode}); resuming from {where}")
    resumed = train(where)
    straight = train(None)
    same = all(torch.equal(resumed[k], straight[k]) for k in straight)
    print("resumed run equals the uninterrupted run" if same else "MISMATCH")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
