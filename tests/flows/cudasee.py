"""What each step sees of the GPUs: a CPU step must see none, a GPU step exactly its own."""

import os

from segue import Flow

flow = Flow("cudasee")


def _seen():
    import torch

    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count()}


@flow.step
def cpu_step(ctx):
    return _seen()


@flow.step(gpus=1, after=[cpu_step])
def gpu_step(ctx):
    import torch

    seen = _seen()
    x = torch.ones(1024, device="cuda")
    seen["sum"] = float(x.sum().item())
    return seen
