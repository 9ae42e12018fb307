"""What the sides of benchmarks.scale's checkpoint figures share: the state each rank
saves, and their half of the conductor's protocol (benchmarks.scale.Conductor).

A rank's state is ``large`` float32 arrays holding ``mb`` MiB between them and
``small`` arrays of 1 KiB, as a model's state dict holds a few large weights and many
small ones (biases, norms, an optimizer's scalars). Every value stays below 2**22, so
each ``+= 1.0`` before a save changes every element exactly: past 2**24 a float32
increment can round back to the same value, and an unchanged array is a blob segue
reuses instead of writing (DCP writes it again): not the same work."""

import os
from pathlib import Path

import numpy as np

SMALL_FLOATS = 256  # 1 KiB


def rank_state(rank: int, mb: int, large: int, small: int, k: int = 0) -> dict[str, np.ndarray]:
    """Rank ``rank``'s state after ``k`` saves (each save adds 1.0 to every array first).

    No array's bytes equal any other's, at this save or any other (each has a pattern
    of its own, ``i * (2j + 1)`` or ``i + SMALL_FLOATS * j``, plus the rank's base and
    k): else segue would reuse the blob written for another array."""
    n = mb * 2**20 // 4 // large
    base = rank * 2**20 + k
    i = np.arange(max(n, SMALL_FLOATS), dtype=np.int64)
    state = {f"rank{rank}.large{j}": ((i[:n] * (2 * j + 1)) % 2**20 + base).astype(np.float32)
             for j in range(large)}
    state.update({f"rank{rank}.small{j}": ((i[:SMALL_FLOATS] + SMALL_FLOATS * j) % 2**20 + base).astype(np.float32)
                  for j in range(small)})
    return state


def tell(gate: Path, line: str) -> None:
    """One line to the conductor (under PIPE_BUF: written whole, never interleaved)."""
    fd = os.open(gate / "inbox", os.O_WRONLY)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def wait_turn(gate: Path, side: str, rank: int, i: int) -> None:
    """Say this rank is ready for save ``i`` of ``side``, and sleep until told to go."""
    tell(gate, f"ready-{side}-{rank}-{i}")
    with open(gate / f"go-{side}-{rank}-{i}", "rb") as go:
        go.read(1)
