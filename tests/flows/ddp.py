"""Two-rank DDP training (gloo, CPU) with a shuffled sampler and dropout.

Every epoch shuffles the records with its own seed and gives each rank half;
dropout draws from torch's global RNG, which segue captures per rank with each
checkpoint. With ``gate=PATH`` the gang holds after step ``hold`` until PATH
exists. Rank 0 returns the final weights.
"""

import os
import time

from segue import Flow

flow = Flow("ddp", params={"epochs": 3, "gate": "", "hold": -1, "lr": 0.05})
RECORDS, BATCH = 64, 4


@flow.step(world_size=2, distributed="gloo", retries=10, checkpoint_every_steps=4)
def train(ctx):
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    p = ctx.params
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=p["lr"], momentum=0.9)
    data = torch.Generator().manual_seed(1)
    x_all = torch.randn(RECORDS, 8, generator=data)
    y_all = x_all.sum(1, keepdim=True)
    per_epoch = RECORDS // BATCH // ctx.world_size
    state = ctx.restore()  # after manual_seed: a resumed rank continues its own dropout stream
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    while step < p["epochs"] * per_epoch:
        if p["gate"] and step >= p["hold"] and not os.path.exists(p["gate"]):
            time.sleep(0.01)
            if ctx.checkpoint_due(step):
                ctx.checkpoint({"model": model.state_dict(), "opt": opt.state_dict(), "step": step})
            continue
        epoch, b = divmod(step, per_epoch)
        order = torch.randperm(RECORDS, generator=torch.Generator().manual_seed(1000 + epoch))
        mine = order[ctx.rank::ctx.world_size][b * BATCH:(b + 1) * BATCH]
        loss = nn.functional.mse_loss(ddp(x_all[mine]), y_all[mine])
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients of both ranks (gloo all-reduce)
        opt.step()
        step += 1
        ctx.progress(step, p["epochs"] * per_epoch)
        if ctx.checkpoint_due(step):
            ctx.checkpoint({"model": model.state_dict(), "opt": opt.state_dict(), "step": step})
    return {"weights": model.state_dict(), "step": step}
