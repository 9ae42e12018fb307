"""The decode loop of the generate handlers: prefill, then one token at a time over the KV cache.

Written here instead of calling ``model.generate()`` because segue needs two
things generate() does not give: a sampled token that depends only on its own
request (a per-request draw keyed by run seed, request id and token position,
so batching, order and a resume never move it), and a hook between tokens
where the step may checkpoint the tokens generated so far. The loop is the
usual one: a left-padded prefill of every active request (prompt plus what it
already generated) with position ids taken from the attention mask, then one
forward of one token per request with ``past_key_values``.

It owns no I/O and knows nothing of steps: the caller passes ``on_chunk``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

STOP, LENGTH = "stop", "length"


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy when ``temperature`` is 0, else sampled.

    Sampling divides the logits by ``temperature``, keeps the ``top_k`` most
    likely tokens (0: all), then the smallest set whose probability reaches
    ``top_p``, and draws one with the request's own uniform number
    (:func:`uniform`): the same request gives the same tokens in any batch.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Request:
    """One request in flight: its prompt's token ids and what it generated so far."""

    rid: str
    prompt_ids: list[int]
    generated: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_at: int | None = None  # the text's length before the stop string that ended it


def uniform(seed: int, rid: str, position: int) -> float:
    """A uniform number in [0, 1) that only (run seed, request id, token position) decide."""
    key = json.dumps([seed, rid, position], separators=(",", ":")).encode()
    return (int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 11) / 2.0**53


def choose(logits: Any, sampling: Sampling, u: float) -> int:
    """The next token from one row of logits (a 1-D torch tensor)."""
    import torch

    if sampling.greedy:
        return int(torch.argmax(logits))  # the first of equal maxima, as generate() does
    x = logits.double() / sampling.temperature
    if sampling.top_k and sampling.top_k < x.numel():
        kth = torch.topk(x, sampling.top_k).values[-1]
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
    probs = torch.softmax(x, dim=-1)
    # Descending probability, ties by token id: a fixed order for the inverse CDF.
    order = torch.argsort(probs, descending=True, stable=True)
    p = probs[order]
    if sampling.top_p < 1.0:
        keep = (torch.cumsum(p, 0) - p) < sampling.top_p  # the smallest prefix reaching top_p
        p = p[keep]
        order = order[keep]
    cdf = torch.cumsum(p, 0)
    i = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype), right=True)[0])
    return int(order[min(i, len(order) - 1)])


def _left_pad(seqs: Sequence[list[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        if s:
            ids[b, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[b, width - len(s):] = 1
    return ids, mask


def decode(model: Any, requests: Sequence[Request], *, sampling: Sampling, max_new_tokens: int,
           eos_ids: set[int], pad_id: int, device: str = "cpu",
           stop_check: Callable[[Request], int | None] | None = None,
           chunk: int = 16, on_chunk: Callable[[], None] | None = None) -> None:
    """Generate into each unfinished request until it stops or reaches ``max_new_tokens``.

    Requests with tokens already (a resumed one) are re-prefilled with prompt
    plus those tokens and go on from there. ``stop_check(request)`` returns the
    text length before a stop string the request's text now contains, or None.
    ``on_chunk()`` is called every ``chunk`` tokens while any request is still
    generating: there the requests' ``generated`` lists are a consistent cut.
    """
    import torch

    active = [r for r in requests if r.finish is None]
    for r in active:  # a resumed request that had reached its end at the cut
        _finish(r, eos_ids, max_new_tokens, stop_check)
    active = [r for r in active if r.finish is None]
    if not active:
        return
    ids, mask = _left_pad([r.prompt_ids + r.generated for r in active], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache_kw = _cache_keyword(model)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        steps = 0
        while True:
            step_ids = []
            live = []
            for b, r in enumerate(active):
                if r.finish is not None:
                    step_ids.append(pad_id)
                    live.append(0)
                    continue
                r.generated.append(choose(logits[b], sampling, uniform(sampling.seed, r.rid, len(r.generated))))
                _finish(r, eos_ids, max_new_tokens, stop_check)
                step_ids.append(r.generated[-1])
                live.append(1)
            steps += 1
            if all(r.finish is not None for r in active):
                return
            if on_chunk is not None and steps % chunk == 0:
                on_chunk()
            # A finished request's column is masked out: it rides along, unseen by the others.
            pos = mask.sum(-1, keepdim=True)
            mask = torch.cat([mask, torch.tensor(live, dtype=mask.dtype, device=device)[:, None]], dim=1)
            step = torch.tensor(step_ids, dtype=torch.long, device=device)[:, None]
            out = model(input_ids=step, attention_mask=mask, position_ids=pos, use_cache=True,
                        **{cache_kw: cache})
            cache = _cache_of(out)
            logits = out.logits[:, -1, :].float()


def _cache_keyword(model: Any) -> str:
    """``cache`` (transformers 5.x) or ``past_key_values`` (4.x; deprecated in 5.x)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _finish(r: Request, eos_ids: set[int], max_new_tokens: int,
            stop_check: Callable[[Request], int | None] | None) -> None:
    if not r.generated:
        return
    if r.generated[-1] in eos_ids:
        r.finish = STOP
        return
    cut = stop_check(r) if stop_check is not None else None
    if cut is not None:
        r.finish, r.stop_at = STOP, cut
    elif len(r.generated) >= max_new_tokens:
        r.finish = LENGTH
