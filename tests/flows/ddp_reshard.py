"""DDP training whose ranks can change between attempts (``GANG_N``, default 2).

Every rank holds the same weights and optimizer (DDP), so each checkpoint is
``replicated=True``: rank 0 writes the state, and a resume with another number
of ranks restores it on every rank. The data is a :class:`GangSampler` over
``RECORDS`` shuffled records: its global position travels in the state, so
the new ranks go on from the same record. Every global batch's indices (all
ranks', gathered) are kept in the state, so the test can check that each
epoch saw every record exactly once. With ``gate=PATH`` the gang holds after
global batch ``hold`` until PATH exists.
"""

import os
import time

from segue import Flow
from segue.data import GangSampler

flow = Flow("ddp_reshard", params={"epochs": 2, "gate": "", "hold": -1})
RECORDS, BATCH = 48, 4


@flow.step(world_size=int(os.environ.get("GANG_N", "2")), distributed="gloo", retries=3,
           checkpoint_every_steps=2)
def train(ctx):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    p = ctx.params
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    x_all = torch.randn(RECORDS, 8, generator=data)
    y_all = x_all.sum(1, keepdim=True)
    sampler = GangSampler(ctx, RECORDS, BATCH, seed=7)
    state = ctx.restore()
    step, seen = 0, []
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load(state["data"])
        step, seen = state["step"], state["seen"]

    def save():
        ctx.checkpoint({"model": model.state_dict(), "opt": opt.state_dict(), "data": sampler.position,
                        "step": step, "seen": seen}, position=sampler.position, replicated=True)

    while sampler.epoch < p["epochs"]:
        epoch = sampler.epoch
        for mine in sampler:
            loss = nn.functional.mse_loss(ddp(x_all[mine]), y_all[mine])
            opt.zero_grad()
            loss.backward()
            opt.step()
            every = [None] * ctx.world_size
            dist.all_gather_object(every, mine)
            seen.append({"epoch": epoch, "ranks": ctx.world_size, "records": [i for b in every for i in b]})
            step += 1
            ctx.progress(step)
            while p["gate"] and step == p["hold"] and not os.path.exists(p["gate"]):
                time.sleep(0.01)
                if ctx.checkpoint_due(step):
                    save()
            if ctx.checkpoint_due(step):
                save()
    return {"seen": seen, "world_size": ctx.world_size, "step": step}
