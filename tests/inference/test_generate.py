"""Generate handlers on a tiny Llama made here (nothing downloaded).

One contract suite runs on every generate handler: the CPU TransformersGenerateHandler
always, VLLMHandler where a GPU and vllm are present (skipped with the reason
otherwise). Then what only the CPU handler has: the equality with
``model.generate()``, resuming from saved tokens (re-prefill) counted token by
token, the tiny model's determinism, and the one-line refusals.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genkit import build_model, prompts

from segue.data import Rejected
from segue.errors import UsageError

torch = pytest.importorskip("torch", reason="torch is not installed; `pip install segue[hf]`")
pytest.importorskip("transformers", reason="transformers is not installed; `pip install segue[hf]`")
pytest.importorskip("tokenizers", reason="tokenizers is not installed; `pip install segue[hf]`")

from segue.inference.handlers import TransformersGenerateHandler, VLLMHandler  # noqa: E402
from segue.inference.unit import UnitState  # noqa: E402

SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 7}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """One torch thread: the 2-core machine is shared, and the SIGKILL tests fork."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny-lm") / "m")


def _vllm_skip() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "no GPU / vllm not installed (`pip install segue[vllm]` on a CUDA machine)"
    if not torch.cuda.is_available():
        return "no GPU / vllm not installed: torch sees no CUDA device"
    return None


@pytest.fixture(params=["transformers", "vllm"])
def make(request: pytest.FixtureRequest, lm: Path) -> Any:
    """A factory of generate handlers of one kind over the tiny model."""
    if request.param == "vllm":
        why = _vllm_skip()
        if why:
            pytest.skip(why)
        loaded: dict[str, Any] = {}

        def vllm(**kw: Any) -> tuple[Any, Any]:
            h = VLLMHandler(lm, gpu_memory_utilization=0.2, max_model_len=256, **kw)
            if "m" not in loaded:
                loaded["m"] = h.load_model()  # one engine per test: vLLM takes the device
            return h, loaded["m"]

        return vllm
    cache: dict[str, Any] = {}

    def hf(**kw: Any) -> tuple[Any, Any]:
        h = TransformersGenerateHandler(lm, device="cpu", **kw)
        if "m" not in cache:
            cache["m"] = h.load_model()
        return h, cache["m"]

    return hf


# -- the contract, on every generate handler ----------------------------------------------------
def test_contract_completion_records(make: Any) -> None:
    h, m = make(max_new_tokens=12)
    out = h.run_inference(prompts(5), m)
    assert [o["id"] for o in out] == [f"p{k:02d}" for k in range(5)]
    for o in out:
        assert set(o) == {"id", "text", "token_ids", "finish_reason", "prompt_tokens", "completion_tokens"}
        assert o["completion_tokens"] == len(o["token_ids"]) <= 12 and o["prompt_tokens"] > 0
        assert o["finish_reason"] in ("stop", "length")
        assert o["finish_reason"] == "stop" or o["completion_tokens"] == 12
        assert isinstance(o["text"], str)
    # A plain string is its own request id.
    assert h.run_inference(["just text"], m)[0]["id"] == "just text"


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_contract_a_request_s_tokens_do_not_depend_on_its_batch(make: Any, mode: str) -> None:
    """Greedy, and seeded sampling (a draw per seed, request id and position): the same
    tokens alone, in a batch, and in the batch reversed."""
    h, m = make(max_new_tokens=16, **(SAMPLED if mode == "sampled" else {}))
    ps = prompts(6)
    batch = h.run_inference(ps, m)
    reverse = h.run_inference(ps[::-1], m)[::-1]
    alone = [h.run_inference([p], m)[0] for p in ps]
    for a, b, c in zip(batch, reverse, alone, strict=True):
        assert a["token_ids"] == b["token_ids"] == c["token_ids"], a["id"]
    if mode == "sampled":  # and the seed matters: another seed, other tokens
        h2, _ = make(max_new_tokens=16, **{**SAMPLED, "seed": 8})
        other = h2.run_inference(ps, m)
        assert [o["token_ids"] for o in other] != [o["token_ids"] for o in batch]


def test_contract_stop_strings_end_the_text_before_them(make: Any) -> None:
    h, m = make(max_new_tokens=24)
    p = prompts(3)[2]
    full = h.run_inference([p], m)[0]
    text = full["text"]
    # A stop string taken from the middle of the greedy text: two ASCII letters.
    at = next(i for i in range(3, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isalpha())
    stop = text[at:at + 2]
    hs, _ = make(max_new_tokens=24, stop=[stop])
    got = hs.run_inference([p], m)[0]
    assert got["finish_reason"] == "stop"
    assert got["text"] == text[: text.find(stop)]
    assert full["token_ids"][: len(got["token_ids"])] == got["token_ids"]
    assert got["completion_tokens"] < full["completion_tokens"]


def test_contract_chat_template(make: Any) -> None:
    h, m = make(max_new_tokens=8, chat=True)
    a, b = h.run_inference([{"id": 1, "prompt": "hello"},
                            {"id": 2, "messages": [{"role": "user", "content": "hello"}]}], m)
    assert a["token_ids"] == b["token_ids"] and a["prompt_tokens"] == b["prompt_tokens"]
    plain, _ = make(max_new_tokens=8)
    assert plain.run_inference([{"id": 1, "prompt": "hello"}], m)[0]["prompt_tokens"] < a["prompt_tokens"]


def test_contract_bad_requests_are_rejected_one_by_one_with_one_line(make: Any) -> None:
    """A bad request is a Rejected in its place (the data step dead-letters that record with
    the reason); the good ones of the same batch are generated as if alone."""
    h, m = make(max_new_tokens=4)
    batch = [{"id": "a", "text": "x"}, {"id": "b", "prompt": "fine"}, {"id": "a", "prompt": 3},
             {"prompt": "x"}, {"id": "b", "prompt": "again"}, 7]
    out = h.run_inference(batch, m)
    assert len(out) == len(batch)
    reasons = [o.reason if isinstance(o, Rejected) else None for o in out]
    assert reasons[1] is None and out[1]["id"] == "b"
    assert out[1]["token_ids"] == h.run_inference([batch[1]], m)[0]["token_ids"]
    for got, want in zip(reasons, [r"^request 'a' has no 'prompt' field$", None,
                                   r"^request 'a': prompt must be a string, not int$",
                                   r"^request 3 of the batch has no 'id' \(a string or an int\)$",
                                   r"^request id 'b' appears twice in the batch; ids must be unique$",
                                   r"^request 5 of the batch must be a string or a record with 'id' and "
                                   r"'prompt', not int$"], strict=True):
        assert (got is None) == (want is None), got
        if want is not None:
            assert re.match(want, got) and "\n" not in got, got
    assert [o.record for o in out if isinstance(o, Rejected)] == [batch[0], batch[2], batch[3], batch[4], 7]


# -- the CPU handler ------------------------------------------------------------------------------
def test_greedy_is_model_generate_token_for_token(lm: Path) -> None:
    h = TransformersGenerateHandler(lm, max_new_tokens=20, device="cpu")
    tok, net = m = h.load_model()
    ps = prompts(4)
    out = h.run_inference(ps, m)
    for p, o in zip(ps, out, strict=True):
        enc = tok(p["prompt"], return_tensors="pt")
        want = net.generate(**enc, max_new_tokens=20, do_sample=False)[0, enc["input_ids"].shape[1]:]
        eos = tok.eos_token_id
        want = want.tolist()
        assert o["token_ids"] == want[: want.index(eos) + 1] if eos in want else o["token_ids"] == want


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_resume_from_saved_tokens_counts_changed_tokens(lm: Path, mode: str) -> None:
    """Re-prefill (prompt + tokens so far, in one forward) against the incremental cache: a
    resume at every cut of 8 requests x 31 cuts; every changed token is counted. Measured on
    CPU float32: 0 of 248 resumed requests changed a token in either mode (docs/inference.md)."""
    h = TransformersGenerateHandler(lm, max_new_tokens=32, device="cpu", **(SAMPLED if mode == "sampled" else {}))
    m = h.load_model()
    ps = prompts(8)
    clean = h.run_inference(ps, m)
    changed_requests = changed_tokens = 0
    for cut in range(1, 32):
        saved = {c["id"]: {"tokens": c["token_ids"][:cut], "finish": None, "stop_at": None}
                 for c in clean if c["completion_tokens"] > cut}
        unit = UnitState(saved, None)
        got = h.run_resumable(ps, m, unit)
        for a, b in zip(clean, got, strict=True):
            if a["token_ids"] != b["token_ids"]:
                changed_requests += 1
                changed_tokens += sum(x != y for x, y in zip(a["token_ids"], b["token_ids"], strict=False))
        assert set(unit.saved) == {c["id"] for c in clean}  # the unit holds every request's end
    assert (changed_requests, changed_tokens) == (0, 0), \
        f"re-prefill changed {changed_tokens} tokens in {changed_requests} of {31 * 8} resumed requests"


def test_checkpoint_offers_every_chunk_with_every_request(lm: Path) -> None:
    h = TransformersGenerateHandler(lm, max_new_tokens=20, checkpoint_tokens=8, device="cpu")
    m = h.load_model()
    seen: list[dict[str, Any]] = []
    h.run_resumable(prompts(3), m, UnitState(None, seen.append))
    assert [sorted(len(v["tokens"]) for v in s.values()) for s in seen] == [[8, 8, 8], [16, 16, 16]]
    json.dumps(seen)  # plain JSON: it goes into the step's checkpoint


def test_tiny_causal_lm_is_deterministic_and_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = build_model(tmp_path / "a", seed=3, heads=4, kv_heads=4, head_dim=32)
    b = build_model(tmp_path / "b", seed=3, heads=4, kv_heads=4, head_dim=32)
    c = build_model(tmp_path / "c", seed=4, heads=4, kv_heads=4, head_dim=32)
    names = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    net = AutoModelForCausalLM.from_pretrained(str(a), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(a), local_files_only=True)
    cfg = net.config
    assert (cfg.model_type, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == ("llama", 4, 4, 32)
    assert len(tok) == 512 and tok.padding_side == "left" and tok.pad_token == "<pad>" and tok.eos_token == "</s>"
    assert tok.decode(tok("batch pipelines resume")["input_ids"]) == "batch pipelines resume"
    with pytest.raises(UsageError, match=r"^tiny_causal_lm: vocab must be at least 259"):
        from segue.inference.testing import tiny_causal_lm

        tiny_causal_lm(tmp_path / "x", vocab=100)


def test_bad_declarations_are_refused_with_one_line(lm: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^handler 'transformers-generate': max_new_tokens must be an int >= 1, "
                                         r"not 0$"):
        TransformersGenerateHandler(lm, max_new_tokens=0)
    with pytest.raises(UsageError, match=r"^handler 'transformers-generate': top_p must be in \(0, 1\]"):
        TransformersGenerateHandler(lm, top_p=0)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(UsageError, match=r"^handler 'transformers-generate': .*bare has no tokenizer"):
        TransformersGenerateHandler(bare)
    (bare / "tokenizer.json").write_text("{}")
    with pytest.raises(UsageError, match=r"chat=True but the tokenizer in .*bare has no chat template"):
        TransformersGenerateHandler(bare, chat=True)
    with pytest.raises(UsageError, match=r"^handler 'vllm': gpu_memory_utilization must be in \(0, 1\]"):
        VLLMHandler(lm, gpu_memory_utilization=1.5)


def test_vllm_memory_fraction_comes_from_the_plan(lm: Path) -> None:
    from segue.inference.gpus import gpu
    from segue.inference.models import preset
    from segue.inference.plan import plan

    p = plan(preset("llama-3.1-8b"), "bf16", gpu("h100"), context=4096, batch=8)
    h = VLLMHandler(lm, plan=p)
    need = p.total_bytes - p.memory.slack
    assert h.gpu_memory_utilization == round(need / p.capacity_bytes, 4) <= 0.9
    assert h.gpu_memory == need and h.gpus == 1
