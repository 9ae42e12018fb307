"""TransformersGenerateHandler: batch generation with a local causal LM, resumable mid-generation.

Requests are prompts (a string, or a record with an id and a ``prompt`` or chat
``messages``); each gives one completion record: ``id``, ``text``,
``token_ids``, ``finish_reason`` (``stop``: end of sequence or a stop string;
``length``: ``max_new_tokens``), ``prompt_tokens``, ``completion_tokens``.

The decode loop is segue's own (:mod:`segue.inference.decode`): a sampled
token depends only on (seed, request id, position), and between tokens the
handler offers the data step a checkpoint holding every request's tokens so
far; the next attempt re-prefills prompt + those tokens and goes on. The
options and request parsing here are shared with the vLLM handler.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ..decode import Request, Sampling, decode
from ..handler import ModelHandler
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


def parse_requests(batch: Sequence[Any], *, chat: bool) -> list[Prompt]:
    """The batch's requests; a bad one is a ValueError naming it (the batch is dead-lettered).

    A string is its own id (two equal prompts give equal completions); a record
    needs ``id`` (str or int) and ``prompt`` (a string) or ``messages`` (chat).
    """
    out: list[Prompt] = []
    for i, req in enumerate(batch):
        if isinstance(req, str):
            out.append(Prompt(req, req, None))
            continue
        if not isinstance(req, Mapping):
            raise ValueError(f"request {i} of the batch must be a string or a record with 'id' and 'prompt', "
                             f"not {type(req).__name__}")
        rid = req.get("id")
        if isinstance(rid, bool) or not isinstance(rid, str | int):
            raise ValueError(f"request {i} of the batch has no 'id' (a string or an int)")
        if "messages" in req and chat:
            msgs = req["messages"]
            if not isinstance(msgs, list) or not all(isinstance(m, Mapping) for m in msgs):
                raise ValueError(f"request {rid!r}: messages must be a list of {{'role', 'content'}} records")
            out.append(Prompt(str(rid), None, [dict(m) for m in msgs]))
            continue
        if "prompt" not in req:
            raise ValueError(f"request {rid!r} has no 'prompt' field")
        if not isinstance(req["prompt"], str):
            raise ValueError(f"request {rid!r}: prompt must be a string, not {type(req['prompt']).__name__}")
        out.append(Prompt(str(rid), req["prompt"], None))
    seen: set[str] = set()
    for p in out:
        if p.rid in seen and isinstance(batch[0], Mapping):
            raise ValueError(f"request id {p.rid!r} appears twice in the batch; ids must be unique")
        seen.add(p.rid)
    return out


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
    """

    def __init__(self, path: str | os.PathLike[str], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: str | Sequence[str] | None = None,
                 chat: bool = False, dtype: str | None = None, checkpoint_tokens: int = 16,
                 **options: Any) -> None:
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

    def run_resumable(self, batch: Sequence[Any], model: Any, unit: Any) -> list[dict[str, Any]]:
        """Generate for ``batch``; with ``unit`` (a data step's batch in flight) resume what a
        previous attempt saved of it and offer a checkpoint every ``checkpoint_tokens`` tokens."""
        tok, net = model
        opts = self.options
        prompts = parse_requests(batch, chat=opts.chat)
        reqs = [Request(p.rid, self._encode(tok, p)) for p in prompts]
        for r in reqs:
            saved = unit.get(r.rid) if unit is not None else None
            if saved is not None:
                r.generated, r.finish, r.stop_at = list(saved["tokens"]), saved["finish"], saved["stop_at"]
        eos = _eos_ids(tok, net)
        pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)

        def save() -> None:
            unit.update({r.rid: {"tokens": list(r.generated), "finish": r.finish, "stop_at": r.stop_at}
                         for r in reqs})
            unit.offer()

        decode(net, reqs, sampling=opts.sampling, max_new_tokens=opts.max_new_tokens, eos_ids=eos, pad_id=pad,
               device=self.resolve_device(), stop_check=self._stop_check(tok), chunk=self.checkpoint_tokens,
               on_chunk=save if unit is not None else None)
        if unit is not None:  # a later call of the same batch must not generate these again
            unit.update({r.rid: {"tokens": list(r.generated), "finish": r.finish, "stop_at": r.stop_at}
                         for r in reqs})
        return [completion(p, self._text(tok, r, eos), r.generated, r.finish or "length", len(r.prompt_ids))
                for p, r in zip(prompts, reqs, strict=True)]

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
        return {"files": files_identity(self.path), "dtype": self.dtype, **self.options.as_json()}

    def bench_inputs(self, n: int) -> list[dict[str, Any]]:
        return [{"id": f"bench-{i}", "prompt": f"request {i}: summarise the night's batch"} for i in range(n)]


def _eos_ids(tok: Any, net: Any) -> set[int]:
    ids = net.generation_config.eos_token_id if getattr(net, "generation_config", None) else None
    out = set(ids if isinstance(ids, list) else [] if ids is None else [ids])
    if tok.eos_token_id is not None:
        out.add(int(tok.eos_token_id))
    return out
