"""A tiny PyTorch model for tests: seeded initialisation, so every process builds the same weights."""

import torch
from infer_kit import DIM


class TinyNet(torch.nn.Module):
    def __init__(self, width: int = 64, seed: int = 7):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1 = torch.nn.Linear(DIM, width)
        self.l2 = torch.nn.Linear(width, 8)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))
