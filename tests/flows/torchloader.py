"""A training step whose data loader resumes mid-epoch: shuffled, with worker processes.

``loader=stateful`` is torchdata's StatefulDataLoader; ``loader=resumable`` a plain
DataLoader over segue's ResumableSampler, wrapped in a ResumableLoader. Either goes
into ``ctx.checkpoint`` as it is. Each attempt appends the indices of every batch it
trained on to ``LOG/epoch-NNNN.jsonl`` (NNNN: the attempt's fencing epoch, so files
sort in attempt order). The model has dropout, so it draws from torch's global RNG
every step: a loader that drew from it on resume would change the weights.
"""

import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from segue import Flow

flow = Flow("torchloader", params={"loader": "stateful", "records": 200, "batch": 8,
                                   "epochs": 2, "workers": 2, "log": "", "holds": ""})


class Synthetic(Dataset):
    """Record i is made from i alone (no files, no download); its index travels along."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return i, x, x.sum().reshape(1)


def make_loader(p):
    data = Synthetic(p["records"])
    if p["loader"] == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(data, batch_size=p["batch"], shuffle=True, num_workers=p["workers"],
                                  generator=torch.Generator().manual_seed(11))
    from segue.data.torch_sampler import ResumableLoader, ResumableSampler

    return ResumableLoader(DataLoader(data, batch_size=p["batch"], num_workers=p["workers"],
                                      sampler=ResumableSampler(data, shuffle=True, seed=11)))


@flow.step(retries=4, checkpoint_every_steps=5)
def train(ctx):
    p = ctx.params
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = make_loader(p)
    step, epoch = 0, 0
    state = ctx.restore()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        loader.load_state_dict(state["loader"])  # no skip-ahead by hand
        step, epoch = state["step"], state["epoch"]
    # The test's gates: "13=PATH" makes step 13 wait for the file PATH, so a kill lands there.
    holds = dict(h.split("=", 1) for h in p["holds"].split(",") if h)
    with open(os.path.join(p["log"], f"epoch-{ctx.epoch:04d}.jsonl"), "a") as log:
        while epoch < p["epochs"]:
            for idx, x, y in loader:
                step += 1
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                log.write(json.dumps({"step": step, "epoch": epoch, "idx": idx.tolist()}) + "\n")
                log.flush()
                while str(step) in holds and not os.path.exists(holds[str(step)]):
                    time.sleep(0.01)
                if ctx.checkpoint_due(step):
                    ctx.checkpoint({"model": model.state_dict(), "opt": opt.state_dict(),
                                    "loader": loader, "step": step, "epoch": epoch})
            epoch += 1
    return {k: v.numpy() for k, v in model.state_dict().items()}
