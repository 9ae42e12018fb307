"""TransformersGenerateHandler: batch generation with a local causal LM, resumable mid-generation.

Requests are prompts (a string, or a record with an id and a ``prompt`` or chat
``messages``); each gives one completion record: ``id``, ``text``,
``token_ids``, ``finish_reason`` (``stop``: end of sequence or a stop string;
``length``: ``max_new_tokens``), ``prompt_tokens``, ``completion_tokens``.

The decode loop is segue's own (:mod:`segue.inference.decode`): a sampled
token depends only on (seed, request id, position), and between tokens the
handler offers the data step a checkpoint holding every request's tokens so
far; the next attempt re-prefills prompt + those tokens and goes on. With a
KV budget (``token_budget=``, ``kv_memory=``, ``plan=``) the batch is a window
whose requests are bucketed by prompt length and decoded in sub-batches that
fit the budget (:mod:`segue.inference.kvbatch`). A bad request (no prompt, a
prompt that is not a string, one too long for the budget) is returned as a
:class:`~segue.data.Rejected` in its place: the data step dead-letters that
record with the reason and the rest of the batch goes on. The options and
request parsing here are shared with the vLLM handler.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.operators import Rejected
from ...errors import UsageError
from ...units import parse_bytes
from ..decode import Request, Sampling, decode
from ..handler import ModelHandler
from ..kvbatch import BatchLog, KVBudget, bucket, budget_from_memory, per_token_bytes
from ._files import existing, files_identity

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class GenerateOptions:
    """What every generate handler takes, checked once (a bad value is a one-line UsageError)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    chat: bool = False

    def check(self, who: str) -> None:
        def bad(what: str) -> UsageError:
            return UsageError(f"handler {who!r}: {what}")

        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise bad(f"max_new_tokens must be an int >= 1, not {self.max_new_tokens!r}")
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            raise bad(f"temperature must be a number >= 0 (0 is greedy), not {self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise bad(f"top_p must be in (0, 1], not {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad(f"top_k must be an int >= 0 (0: no limit), not {self.top_k!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise bad(f"seed must be an int, not {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad(f"stop must be non-empty strings, not {list(self.stop)!r}")

    @property
    def sampling(self) -> Sampling:
        return Sampling(float(self.temperature), float(self.top_p), int(self.top_k), int(self.seed))

    def as_json(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed, "stop": list(self.stop), "chat": self.chat}


def generate_options(who: str, *, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                     seed: int, stop: str | Sequence[str] | None, chat: bool) -> GenerateOptions:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    opts = GenerateOptions(max_new_tokens, temperature, top_p, top_k, seed, stops, bool(chat))
    opts.check(who)
    return opts


@dataclass(frozen=True)
class Prompt:
    """One request as parsed: its id, and either a text or chat messages."""

    rid: str
    text: str | None
    messages: list[dict[str, str]] | None


def parse_requests(batch: Sequence[Any], *, chat: bool) -> list[Prompt | Rejected]:
    """The batch's requests, in order; a bad one is a :class:`Rejected` with a one-line reason
    in its place (the data step dead-letters that record; the others go on).

    A string is its own id (two equal prompts give equal completions); a record
    needs ``id`` (str or int) and ``prompt`` (a string) or ``messages`` (chat).
    An id seen before in the batch is rejected (the first one runs).
    """
    out: list[Prompt | Rejected] = []
    seen: set[str] = set()
    for i, req in enumerate(batch):
        p = _parse_one(i, req, chat)
        if isinstance(p, Prompt) and isinstance(req, Mapping):  # a bare string may repeat
            if p.rid in seen:
                p = Rejected(req, f"request id {p.rid!r} appears twice in the batch; ids must be unique", i)
            else:
                seen.add(p.rid)
        out.append(p)
    return out


def _parse_one(i: int, req: Any, chat: bool) -> Prompt | Rejected:
    if isinstance(req, str):
        return Prompt(req, req, None)
    if not isinstance(req, Mapping):
        return Rejected(req, f"request {i} of the batch must be a string or a record with 'id' and 'prompt', "
                             f"not {type(req).__name__}", i)
    rid = req.get("id")
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        return Rejected(req, f"request {i} of the batch has no 'id' (a string or an int)", i)
    if "messages" in req and chat:
        msgs = req["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, Mapping) for m in msgs):
            return Rejected(req, f"request {rid!r}: messages must be a list of {{'role', 'content'}} records", i)
        return Prompt(str(rid), None, [dict(m) for m in msgs])
    if "prompt" not in req:
        return Rejected(req, f"request {rid!r} has no 'prompt' field", i)
    if not isinstance(req["prompt"], str):
        return Rejected(req, f"request {rid!r}: prompt must be a string, not {type(req['prompt']).__name__}", i)
    return Prompt(str(rid), req["prompt"], None)


def check_model_dir(path: Path, who: str, *, chat: bool) -> None:
    """Refuse at declaration (exit 2 at submit) a directory without a tokenizer, or without a
    chat template when ``chat=True``."""
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise UsageError(f"handler {who!r}: {path} has no tokenizer (tokenizer.json or tokenizer_config.json); "
                         f"save the tokenizer next to the model")
    if chat and not _has_chat_template(path):
        raise UsageError(f"handler {who!r}: chat=True but the tokenizer in {path} has no chat template; "
                         f"give plain prompts (chat=False) or add a chat_template")


def _has_chat_template(path: Path) -> bool:
    import json

    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    cfg = path / "tokenizer_config.json"
    try:
        return bool(json.loads(cfg.read_text()).get("chat_template")) if cfg.is_file() else False
    except (OSError, ValueError):
        return False


def completion(p: Prompt, text: str, token_ids: list[int], finish: str, prompt_tokens: int) -> dict[str, Any]:
    return {"id": p.rid, "text": text, "token_ids": token_ids, "finish_reason": finish,
            "prompt_tokens": prompt_tokens, "completion_tokens": len(token_ids)}


class TransformersGenerateHandler(ModelHandler[Any]):
    """``AutoModelForCausalLM`` + its tokenizer from ``path`` (offline), generating per request.

    ``temperature=0`` is greedy; otherwise ``top_k``/``top_p`` sampling with a
    draw per (``seed``, request id, token position). ``stop``: strings that end
    a completion (the text stops before them). ``chat=True`` wraps each prompt
    (or a record's ``messages``) in the tokenizer's chat template.
    ``checkpoint_tokens``: in a data step, every that many new tokens the
    handler offers a checkpoint of the tokens so far (a pause parks there).

    KV budget (at most one; none: the whole batch decodes at once, as given):
    ``token_budget=N`` bounds a sub-batch's cached tokens, ``rows x (longest
    prompt + max_new_tokens)``; ``kv_memory="6GB"`` bounds its KV cache plus
    prefill activations, per token from the model's ``config.json``;
    ``plan=`` takes the memory a :class:`segue.inference.plan.Plan` leaves
    after the weights; ``token_budget="auto"`` the memory the device leaves
    after the loaded weights (a ``segue bench-model`` profile of this handler
    when the home has one). The batch (``batch_size`` records) is then the
    window whose requests are bucketed by prompt length.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: str | Sequence[str] | None = None,
                 chat: bool = False, dtype: str | None = None, checkpoint_tokens: int = 16,
                 token_budget: int | str | None = None, kv_memory: str | int | None = None,
                 plan: Any = None, **options: Any) -> None:
        options.setdefault("name", "transformers-generate")
        super().__init__(**options)
        self.path = existing(path, f"handler {self.name!r}: path", directory=True)
        self.options = generate_options(self.name, max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_p=top_p, top_k=top_k, seed=seed, stop=stop, chat=chat)
        check_model_dir(self.path, self.name, chat=chat)
        if isinstance(checkpoint_tokens, bool) or not isinstance(checkpoint_tokens, int) \
                or not 1 <= checkpoint_tokens <= 32:
            raise UsageError(f"handler {self.name!r}: checkpoint_tokens must be an int in 1..32, "
                             f"not {checkpoint_tokens!r}")
        self.checkpoint_tokens = checkpoint_tokens
        self.dtype = dtype
        self.token_budget, self.kv_memory, self.plan = check_budget(
            self.name, self.path, self.options.max_new_tokens, token_budget, kv_memory, plan)
        self.batch_log = BatchLog()  # this process's sub-batches (reported when the model is released)
        self._budgets: dict[tuple[str, str | None], KVBudget | None] = {}

    def load_model(self) -> Any:
        import torch
        import transformers as tf

        tok = tf.AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        tok.padding_side = "left"
        kw = {"dtype": getattr(torch, self.dtype)} if self.dtype else {}
        net: Any = tf.AutoModelForCausalLM.from_pretrained(str(self.path), local_files_only=True, **kw)
        if tok.pad_token_id is None and tok.eos_token_id is None:
            raise UsageError(f"handler {self.name!r}: the tokenizer in {self.path} has neither a pad nor an "
                             f"eos token")
        return tok, net.to(self.resolve_device()).eval()

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        return self.run_resumable(batch, model, None)

    def run_resumable(self, batch: Sequence[Any], model: Any, unit: Any) -> list[Any]:
        """Generate for ``batch``; with ``unit`` (a data step's batch in flight) resume what a
        previous attempt saved of it and offer a checkpoint every ``checkpoint_tokens`` tokens
        and between sub-batches. A request that cannot run is a :class:`Rejected` in its place."""
        tok, net = model
        opts = self.options
        parsed = parse_requests(batch, chat=opts.chat)
        good = [(i, p) for i, p in enumerate(parsed) if isinstance(p, Prompt)]
        reqs = [Request(p.rid, self._encode(tok, p)) for _, p in good]
        for r in reqs:
            saved = unit.get(r.rid) if unit is not None else None
            if saved is not None:
                r.generated, r.finish, r.stop_at = list(saved["tokens"]), saved["finish"], saved["stop_at"]
        eos = _eos_ids(tok, net)
        pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
        budget = self.kv_budget(net, getattr(unit, "home", None))
        cut = bucket([len(r.prompt_ids) for r in reqs], opts.max_new_tokens, budget)
        self.batch_log.too_long += len(cut.too_long)

        def save() -> None:
            unit.update({r.rid: {"tokens": list(r.generated), "finish": r.finish, "stop_at": r.stop_at}
                         for r in reqs if r.generated or r.finish})
            unit.offer()

        for n, group in enumerate(cut.groups):
            rows = [reqs[j] for j in group]
            if any(r.finish is None for r in rows):  # not one a previous attempt finished
                self.batch_log.note(len(rows), max(len(r.prompt_ids) for r in rows), opts.max_new_tokens,
                                    budget)
            decode(net, rows, sampling=opts.sampling, max_new_tokens=opts.max_new_tokens, eos_ids=eos,
                   pad_id=pad, device=self.resolve_device(), stop_check=self._stop_check(tok),
                   chunk=self.checkpoint_tokens, on_chunk=save if unit is not None else None)
            if unit is not None and n + 1 < len(cut.groups):
                save()  # a sub-batch's end is a boundary too: a pause parks here
        if unit is not None:  # a later call of the same batch must not generate these again
            unit.update({r.rid: {"tokens": list(r.generated), "finish": r.finish, "stop_at": r.stop_at}
                         for r in reqs if r.generated or r.finish})
        out: list[Any] = list(parsed)
        for j, ((i, p), r) in enumerate(zip(good, reqs, strict=True)):
            if j in cut.too_long:
                out[i] = Rejected(batch[i], f"request {p.rid!r} {cut.too_long[j]}", i)
            else:
                out[i] = completion(p, self._text(tok, r, eos), r.generated, r.finish or "length",
                                    len(r.prompt_ids))
        return out

    def kv_budget(self, net: Any, home: str | None = None) -> KVBudget | None:
        """The budget of a sub-batch on this device (None: no budget), resolved once per
        device and home: the given one, or for ``"auto"`` the memory the device leaves."""
        key = (self.resolve_device(), home)
        if key not in self._budgets:
            self._budgets[key] = self._resolve_budget(net, home)
        return self._budgets[key]

    def _resolve_budget(self, net: Any, home: str | None) -> KVBudget | None:
        from ..models import load_config

        if isinstance(self.token_budget, int):
            return KVBudget(self.token_budget)
        if self.token_budget is None and self.kv_memory is None and self.plan is None:
            return None
        elem = _elem_bytes(net)
        if self.plan is not None:  # per device, at the plan's KV and activation dtypes
            p = self.plan
            left = (p.capacity_bytes - p.memory.slack - p.memory.cuda_context - p.memory.weights
                    - p.memory.quant_metadata)
            _, act = per_token_bytes(p.model, int(p.quant.act_bytes))
            return KVBudget(max(int(left), 0), int(p.kv_bytes_per_token_per_device), act, "plan")
        model = load_config(self.path)
        if self.kv_memory is not None:
            return budget_from_memory(model, self.kv_memory, elem, "kv_memory")
        left, source = self._memory_left(net, home)
        return budget_from_memory(model, left, elem, source)

    def _memory_left(self, net: Any, home: str | None) -> tuple[int, str]:
        """What the device leaves after the model: from this handler's measured profile in
        ``home`` when there is one, else the device's capacity less the slack, the CUDA
        context and the loaded weights (the planner's assumptions, docs/planner.md)."""
        from ..capacity import device_capacity
        from ..plan import Assumptions
        from ..profiles import device_type_of, load_profile

        a = Assumptions()
        device = self.resolve_device()
        prof = load_profile(home, self.name, self.version, device_type_of(device)) if home else None
        if prof is not None and prof.get("capacity_bytes") and prof.get("memory_after_load_bytes"):
            return int(prof["capacity_bytes"] * (1 - a.slack) - prof["memory_after_load_bytes"]), "profile"
        capacity, where = device_capacity(device)
        ctx = a.cuda_context_bytes if device.startswith("cuda") else 0
        return int(capacity * (1 - a.slack) - ctx - (self.model_bytes((None, net)) or 0)), f"device: {where}"

    def segue_batch_report(self) -> tuple[str, dict[str, Any]] | None:
        """What this process decoded since the last report (one event when the model is
        released), and a fresh log; None if nothing."""
        log, self.batch_log = self.batch_log, BatchLog()
        if not log:
            return None
        return f"generate {self.name}: {log.summary()}", log.to_json()

    def _encode(self, tok: Any, p: Prompt) -> list[int]:
        if self.options.chat:
            msgs = p.messages if p.messages is not None else [{"role": "user", "content": p.text or ""}]
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(p.text or "")["input_ids"])

    def _stop_check(self, tok: Any) -> Any:
        stops = self.options.stop
        if not stops:
            return None

        def check(r: Request) -> int | None:
            text = tok.decode(r.generated, skip_special_tokens=True)
            hits = [i for i in (text.find(s) for s in stops) if i >= 0]
            return min(hits) if hits else None

        return check

    def _text(self, tok: Any, r: Request, eos: set[int]) -> str:
        ids = r.generated[:-1] if r.generated and r.generated[-1] in eos else r.generated
        text = str(tok.decode(ids, skip_special_tokens=True))
        return text[: r.stop_at] if r.stop_at is not None else text

    def model_bytes(self, model: Any) -> int | None:
        return super().model_bytes(model[1])

    def config(self) -> dict[str, Any]:
        budget: dict[str, Any] = {}
        if self.token_budget is not None or self.kv_memory is not None:
            budget = {"token_budget": self.token_budget, "kv_memory": self.kv_memory}
        if self.plan is not None:
            budget["plan"] = {"model": self.plan.model.name, "gpu": self.plan.gpu.key,
                              "capacity_bytes": self.plan.capacity_bytes, "total_bytes": self.plan.total_bytes}
        return {"files": files_identity(self.path), "dtype": self.dtype, **self.options.as_json(), **budget}

    def bench_inputs(self, n: int) -> list[dict[str, Any]]:
        return [{"id": f"bench-{i}", "prompt": f"request {i}: summarise the night's batch"} for i in range(n)]


def check_budget(who: str, path: Path, new: int, token_budget: Any, kv_memory: Any, plan: Any
                 ) -> tuple[int | str | None, int | None, Any]:
    """The KV budget options, checked at declaration (exit 2 at submit): at most one of them;
    a token budget an int or ``"auto"``, above ``max_new_tokens`` (else no request fits);
    ``kv_memory`` a size; with ``kv_memory`` or ``"auto"`` the model's ``config.json`` readable
    by the planner (it gives the bytes per token); a plan that fits."""
    from ..models import load_config

    def bad(what: str) -> UsageError:
        return UsageError(f"handler {who!r}: {what}")

    given = [k for k, v in (("token_budget", token_budget), ("kv_memory", kv_memory), ("plan", plan))
             if v is not None]
    if len(given) > 1:
        raise bad(f"give one of token_budget, kv_memory and plan, not {' and '.join(given)}")
    if token_budget is not None and token_budget != "auto":
        if isinstance(token_budget, bool) or not isinstance(token_budget, int):
            raise bad(f"token_budget must be an int (tokens) or 'auto', not {token_budget!r}")
        if token_budget <= new:
            raise bad(f"token_budget {token_budget} leaves no room for a prompt: it must be above "
                      f"max_new_tokens {new}")
    memory = None
    if kv_memory is not None:
        memory = parse_bytes(kv_memory, f"handler {who!r}: kv_memory", error=UsageError)
        if memory < 1:
            raise bad(f"kv_memory must be more than 0 bytes, not {kv_memory!r}")
    if plan is not None:
        if not hasattr(plan, "memory") or not hasattr(plan, "capacity_bytes"):
            raise bad(f"plan must be a segue.inference.plan.Plan, not {type(plan).__name__}")
        if not plan.fits:
            raise bad(f"the plan for {plan.model.name} does not fit on {plan.gpu.key}; "
                      f"lower its batch or context, or plan another GPU")
    if memory is not None or token_budget == "auto":
        try:
            load_config(path)
        except UsageError as exc:
            raise bad(f"the KV budget needs the model's config.json: {exc}") from None
    return token_budget, memory, plan


def _elem_bytes(net: Any) -> int:
    """Bytes per number of the loaded model's parameters (its KV cache and activations)."""
    dtype = getattr(net, "dtype", None)
    size = getattr(dtype, "itemsize", None)
    return int(size) if isinstance(size, int) and size > 0 else 4


def _eos_ids(tok: Any, net: Any) -> set[int]:
    ids = net.generation_config.eos_token_id if getattr(net, "generation_config", None) else None
    out = set(ids if isinstance(ids, list) else [] if ids is None else [ids])
    if tok.eos_token_id is not None:
        out.add(int(tok.eos_token_id))
    return out
