"""VLLMHandler: batch generation on vLLM's offline engine (``vllm.LLM.generate``), on a GPU.

The same options, requests and completion records as
:class:`~segue.inference.handlers.generate.TransformersGenerateHandler`
(one contract suite runs on both). Sampling is seeded per request: each
request's ``SamplingParams.seed`` is derived from the handler's seed and the
request id, so batching and order do not move a request's tokens. vLLM
exposes no hook between tokens, so a checkpoint falls between batches only:
a resume regenerates the batch that was in flight (exactly once still holds,
at the request level). vLLM is imported only when the model loads.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from ...errors import UsageError
from ..handler import ModelHandler, free_torch_cuda_cache
from ._files import existing, files_identity
from .generate import Prompt, check_model_dir, completion, generate_options, parse_requests


def request_seed(seed: int, rid: str) -> int:
    """vLLM's per-request seed: only the run's seed and the request id decide it."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{rid}".encode(), digest_size=4).digest(), "big")


def utilization_from_plan(plan: Any) -> float:
    """``gpu_memory_utilization`` for a :class:`segue.inference.plan.Plan`: what it needs
    (weights, KV cache of its batch x context, activations, CUDA context) over the
    device's capacity, at most 1 - its slack."""
    if not plan.fits:
        raise UsageError(f"the plan for {plan.model.name} does not fit on {plan.gpu.key} "
                         f"(batch {plan.batch}, context {plan.context}); lower them or plan another GPU")
    need = plan.total_bytes - plan.memory.slack
    return round(min(need / plan.capacity_bytes, 1.0 - plan.assumptions.slack), 4)


class VLLMHandler(ModelHandler[Any]):
    """A causal LM directory on ``vllm.LLM`` (``segue[vllm]``, a CUDA GPU).

    ``gpu_memory_utilization``: the fraction of the device vLLM may take;
    with ``plan=`` (a :class:`segue.inference.plan.Plan`) it is the plan's
    need over capacity (:func:`utilization_from_plan`), and the plan's bytes
    become the step's ``gpu_memory`` hint unless one is given.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: str | Sequence[str] | None = None,
                 chat: bool = False, dtype: str = "auto", gpu_memory_utilization: float | None = None,
                 plan: Any = None, max_model_len: int | None = None, **options: Any) -> None:
        options.setdefault("name", "vllm")
        if plan is not None:
            if gpu_memory_utilization is not None:
                raise UsageError("give gpu_memory_utilization or plan, not both")
            gpu_memory_utilization = utilization_from_plan(plan)
            options.setdefault("gpu_memory", plan.total_bytes - plan.memory.slack)
        options.setdefault("gpus", 1)
        super().__init__(**options)
        self.path = existing(path, f"handler {self.name!r}: path", directory=True)
        self.options = generate_options(self.name, max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_p=top_p, top_k=top_k, seed=seed, stop=stop, chat=chat)
        check_model_dir(self.path, self.name, chat=chat)
        util = 0.9 if gpu_memory_utilization is None else gpu_memory_utilization
        if not isinstance(util, int | float) or not 0 < util <= 1:
            raise UsageError(f"handler {self.name!r}: gpu_memory_utilization must be in (0, 1], not {util!r}")
        self.gpu_memory_utilization = float(util)
        self.dtype, self.max_model_len = dtype, max_model_len

    def load_model(self) -> Any:
        import vllm  # segue[vllm]; an ImportError fails the attempt without a retry

        kw: dict[str, Any] = {}
        if self.max_model_len is not None:
            kw["max_model_len"] = self.max_model_len
        return vllm.LLM(model=str(self.path), tokenizer=str(self.path), dtype=self.dtype,
                        seed=self.options.seed, gpu_memory_utilization=self.gpu_memory_utilization, **kw)

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        from vllm import SamplingParams

        o = self.options
        parsed = parse_requests(batch, chat=o.chat)
        prompts = [p for p in parsed if isinstance(p, Prompt)]
        tok = model.get_tokenizer()
        texts = []
        for p in prompts:
            if o.chat:
                msgs = p.messages if p.messages is not None else [{"role": "user", "content": p.text or ""}]
                texts.append(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
            else:
                texts.append(p.text or "")
        params = [SamplingParams(max_tokens=o.max_new_tokens, temperature=o.temperature, top_p=o.top_p,
                                 top_k=o.top_k if o.top_k else -1, stop=list(o.stop) or None,
                                 seed=request_seed(o.seed, p.rid)) for p in prompts]
        outs = iter(model.generate(texts, params, use_tqdm=False) if prompts else [])
        result: list[Any] = []
        for q in parsed:  # a rejected request stays a Rejected in its place (dead-lettered)
            if not isinstance(q, Prompt):
                result.append(q)
                continue
            c = (out := next(outs)).outputs[0]
            finish = "length" if c.finish_reason == "length" else "stop"
            result.append(completion(q, c.text, list(c.token_ids), finish, len(out.prompt_token_ids)))
        return result

    def release(self, model: Any) -> None:
        del model
        free_torch_cuda_cache()

    def model_bytes(self, model: Any) -> int | None:
        return None

    def config(self) -> dict[str, Any]:
        return {"files": files_identity(self.path), "dtype": self.dtype,
                "gpu_memory_utilization": self.gpu_memory_utilization, "max_model_len": self.max_model_len,
                **self.options.as_json()}
