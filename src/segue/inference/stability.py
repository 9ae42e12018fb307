"""Whether a batch size's measured latencies are steady enough to recommend a batch from.

``segue bench-model`` on a busy machine once recommended batch 128 from figures
whose p95 was 9x their p50 (issue 40) and saved that as the profile that
``batch_size="auto"`` runs at. A batch size's steady batches are now measured in
*rounds*: :func:`again` says whether to measure one more round, :func:`settle`
which round to keep and whether it is stable. Both are pure functions over the
latencies, so tests give them samples and need no clock; :mod:`segue.inference.bench`
runs the rounds, and the CLI refuses to save an unstable profile unless asked.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MAX_SPREAD = 2.0  # p95 / p50 of a round's batch latencies above which it is noise, not a figure
MAX_ROUNDS = 4  # the first round and at most 3 repeats: a bound on a busy machine's wait


def p95(xs: Sequence[float]) -> float:
    """The nearest-rank 95th percentile (with few batches: the slowest one)."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def spread(latencies: Sequence[float]) -> float:
    """p95 / p50 of one round's batch latencies (1.0: every batch took as long); inf when the
    median is not above zero, or there are no latencies.

    The p50 is the lower median: a large batch size may have only two steady batches,
    and the mean of a fast and a slow one would hide the slow one (``[1, 9]``: 9, not 1.8).
    """
    if not latencies:
        return math.inf
    mid = statistics.median_low(latencies)
    return p95(latencies) / mid if mid > 0 else math.inf


@dataclass(frozen=True)
class Verdict:
    """Which round of a batch size to report, its spread, and whether it is under the bound."""

    round: int  # index into the rounds
    spread: float
    stable: bool
    rounds: int  # how many were measured


def settle(rounds: Sequence[Sequence[float]], max_spread: float = MAX_SPREAD) -> Verdict:
    """The first round whose spread is at most ``max_spread`` (stable); when none is, the
    round of least spread, marked unstable. Noise on a shared machine only slows batches
    down, so the least noisy round is the nearest to what the model does alone."""
    if not rounds:
        raise ValueError("settle needs at least one round of latencies")
    spreads = [spread(r) for r in rounds]
    for i, s in enumerate(spreads):
        if s <= max_spread:
            return Verdict(i, s, True, len(rounds))
    best = min(range(len(rounds)), key=lambda i: spreads[i])
    return Verdict(best, spreads[best], False, len(rounds))


def again(
    rounds: Sequence[Sequence[float]], max_spread: float = MAX_SPREAD, max_rounds: int = MAX_ROUNDS
) -> bool:
    """Whether to measure one more round: none is stable yet and fewer than ``max_rounds`` ran."""
    return len(rounds) < max_rounds and not (rounds and settle(rounds, max_spread).stable)
