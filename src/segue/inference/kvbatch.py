"""KV-aware batching of generate requests: bucket a window by prompt length, cut it under a budget.

A data step hands a generate handler a window of requests (its batch, cut at
fixed record positions). The window is decoded in sub-batches: its requests
sorted by prompt length (ties by position), then cut greedily so that each
sub-batch's cost stays within the budget::

    cost = batch * (longest prompt + max_new_tokens) * KV bytes per token      (the cache at the end)
         + batch * longest prompt * activation bytes per prompt token           (the prefill pass)

Left padding makes every row of a sub-batch as long as its longest prompt,
which is why the requests are bucketed by length first. A request whose cost
alone is above the budget can never run: it is set aside with a one-line
reason (the data step dead-letters it) instead of failing the batch on every
retry. The cut depends only on the window's prompt lengths and the budget,
so a resumed attempt decodes exactly the sub-batches an uninterrupted one
does. Pure arithmetic: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from .models import Model

__all__ = ["BatchLog", "Buckets", "KVBudget", "bucket", "per_token_bytes"]


@dataclass(frozen=True)
class KVBudget:
    """The most a sub-batch may cost, in bytes, or in KV tokens for a ``token_budget``.

    ``kv_per_token`` and ``act_per_token`` are the bytes of one cached token
    and of one prompt token in flight at prefill; a token budget counts each
    cached token as 1 and no activations. ``source`` says where the limit came
    from (``token_budget``, ``kv_memory``, ``plan``, ``profile``, ``device``).
    """

    limit: int
    kv_per_token: int = 1
    act_per_token: int = 0
    source: str = "token_budget"

    def cost(self, batch: int, width: int, new: int) -> int:
        """What ``batch`` rows of ``width`` prompt tokens generating ``new`` tokens cost."""
        return batch * (width + new) * self.kv_per_token + batch * width * self.act_per_token

    @property
    def unit(self) -> str:
        return "tokens" if self.kv_per_token == 1 and self.act_per_token == 0 else "bytes"

    def describe(self) -> str:
        return f"{self.limit} {self.unit} ({self.source})"

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "unit": self.unit, "kv_per_token": self.kv_per_token,
                "act_per_token": self.act_per_token, "source": self.source}


def per_token_bytes(model: Model, elem_bytes: int) -> tuple[int, int]:
    """(KV bytes per cached token, activation bytes per prefill token) of ``model`` at ``elem_bytes``.

    KV: ``2 * layers * kv_heads * head_dim * elem`` (docs/planner.md). A
    prefill token in flight: the residual stream and its normed copy, q/k/v,
    the gated MLP's two up-projections (the planner's activation formula), and
    its row of logits (transformers computes the LM head at every prompt
    position). Eager attention scores and the allocator's slack are not counted.
    """
    kv = 2 * model.layers * model.kv_heads * model.head_dim * elem_bytes
    act = elem_bytes * (2 * model.hidden + (model.heads + 2 * model.kv_heads) * model.head_dim
                        + 2 * model.intermediate * model.experts_per_token + model.vocab)
    return kv, act


def budget_from_memory(model: Model, memory_left: int, elem_bytes: int, source: str) -> KVBudget:
    """A byte budget of ``memory_left`` for ``model``'s KV cache and prefill activations."""
    if model.encoder:
        raise UsageError(f"{model.name} is an encoder (no KV cache); a generate handler needs a causal LM")
    kv, act = per_token_bytes(model, elem_bytes)
    return KVBudget(max(int(memory_left), 0), kv, act, source)


@dataclass(frozen=True)
class Buckets:
    """A window cut into sub-batches: each a list of window indices, shortest prompts first;
    ``too_long`` maps an index to the reason it cannot run at all."""

    groups: list[list[int]]
    too_long: dict[int, str] = field(default_factory=dict)


def bucket(lengths: Sequence[int], new: int, budget: KVBudget | None) -> Buckets:
    """Cut a window of prompts of ``lengths`` tokens, each generating up to ``new`` tokens.

    Without a budget the window is one batch in its own order (as before
    budgets existed). With one, requests are sorted by (length, position) and
    each sub-batch grows while its cost at its longest prompt stays within the
    budget; a request over the budget alone is left out with its reason.
    """
    if budget is None:
        return Buckets([list(range(len(lengths)))] if lengths else [])
    too_long: dict[int, str] = {}
    order = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        need = budget.cost(1, lengths[i], new)
        if need > budget.limit:
            too_long[i] = (f"needs {need} {budget.unit} alone (a prompt of {lengths[i]} tokens + "
                           f"max_new_tokens {new}), above the batch budget of {budget.describe()}; "
                           f"shorten the prompt or raise the budget")
        else:
            order.append(i)
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:  # ascending length: the newest request is the sub-batch's longest
        if cur and budget.cost(len(cur) + 1, lengths[i], new) > budget.limit:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return Buckets(groups, too_long)


class BatchLog:
    """What a handler decoded in one process: sub-batch shapes (rows, padded prompt width) and
    how often each ran, the largest cost, and the budget; reported as an event when the
    model is released (:meth:`segue.inference.session.ModelSession.close`)."""

    MAX_SHAPES = 200  # the event stays small; the counts still cover every batch

    def __init__(self) -> None:
        self.shapes: Counter[tuple[int, int]] = Counter()
        self.batches = self.requests = self.too_long = 0
        self.max_cost = 0
        self.max_new_tokens = 0
        self.budget: KVBudget | None = None

    def note(self, rows: int, width: int, new: int, budget: KVBudget | None) -> None:
        self.shapes[(rows, width)] += 1
        self.batches += 1
        self.requests += rows
        self.max_new_tokens = new
        self.budget = budget
        if budget is not None:
            self.max_cost = max(self.max_cost, budget.cost(rows, width, new))

    def __bool__(self) -> bool:
        return bool(self.batches or self.too_long)

    def to_json(self) -> dict[str, Any]:
        shapes = sorted(self.shapes.items())
        return {"batches": self.batches, "requests": self.requests, "too_long": self.too_long,
                "max_new_tokens": self.max_new_tokens, "max_cost": self.max_cost,
                "budget": None if self.budget is None else self.budget.to_json(),
                "shapes": [[rows, width, n] for (rows, width), n in shapes[: self.MAX_SHAPES]],
                "shapes_left_out": max(0, len(shapes) - self.MAX_SHAPES)}

    def summary(self) -> str:
        if self.budget is None:
            return f"{self.batches} batches of {self.requests} requests, no KV budget"
        pct = math.floor(100 * self.max_cost / self.budget.limit) if self.budget.limit else 0
        return (f"{self.batches} batches of {self.requests} requests within a budget of "
                f"{self.budget.describe()} (largest {pct}% of it), {self.too_long} too long")
