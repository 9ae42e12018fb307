"""Test models made here, never downloaded: a tiny random Llama and its own tokenizer.

:func:`tiny_causal_lm` writes a directory that ``AutoModelForCausalLM`` and
``AutoTokenizer`` load offline: a random-initialised ``LlamaForCausalLM``
(``save_pretrained``, safetensors) and a byte-level BPE tokenizer trained with
``tokenizers`` on text this module generates from the seed. The same arguments
write the same files, byte for byte, so tests and demos can build several
shapes (GQA or not, other head dims) without a network.

It must never fetch anything: no hub name is ever passed to transformers.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from ..errors import UsageError

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIALS = (PAD, BOS, EOS)
# A plain role-tagged template: enough for apply_chat_template(add_generation_prompt=True).
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}" + EOS + "\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
_WORDS = ("the model reads a prompt and writes tokens one at a time while the cache keeps keys and values "
          "of every layer so nothing is computed twice batch pipelines resume after a pause where they "
          "stopped data flows through steps each record once ships planes rivers cities numbers forty "
          "seven red green blue fast slow night morning report summary question answer").split()


def corpus(seed: int, lines: int = 400) -> list[str]:
    """Deterministic training text for the tokenizer: words, digits, punctuation and chat tags."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        line = " ".join(words) + rng.choice((".", "?", "!", ",", ":"))
        if rng.random() < 0.2:
            line = f"<|user|>\n{line}"
        out.append(line)
    return out


def tiny_causal_lm(path: str | os.PathLike[str], *, layers: int = 2, hidden: int = 64, heads: int = 4,
                   kv_heads: int = 2, vocab: int = 512, seed: int = 0, head_dim: int | None = None,
                   intermediate: int | None = None, max_positions: int = 512) -> Path:
    """Write a random-initialised Llama causal LM and its tokenizer to ``path``; return the path.

    ``kv_heads`` below ``heads`` is grouped-query attention (``heads`` must be a
    multiple of it); ``head_dim`` defaults to ``hidden // heads``. ``vocab`` is
    the tokenizer's size (at least the 256 bytes plus 3 special tokens) and the
    model's embedding rows. The tokenizer pads on the left, has ``<pad>``,
    ``<s>``, ``</s>`` (the end of a turn and of a completion) and a chat
    template. The global RNGs are left as they were.
    """
    if vocab < 256 + len(SPECIALS):
        raise UsageError(f"tiny_causal_lm: vocab must be at least {256 + len(SPECIALS)} "
                         f"(256 bytes and {len(SPECIALS)} special tokens), not {vocab}")
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise UsageError(f"tiny_causal_lm: heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    if head_dim is None and hidden % heads:
        raise UsageError(f"tiny_causal_lm: hidden ({hidden}) must be a multiple of heads ({heads}), "
                         f"or give head_dim")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(seed, vocab)
    tok.save_pretrained(str(out))
    _model(out, tok, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab, seed=seed,
           head_dim=head_dim or hidden // heads, intermediate=intermediate or 2 * hidden,
           max_positions=max_positions)
    return out


def _tokenizer(seed: int, vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   padding_side="left", chat_template=CHAT_TEMPLATE)


def _model(out: Path, tok: object, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int,
           seed: int, head_dim: int, intermediate: int, max_positions: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}  # type: ignore[attr-defined]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=head_dim, max_position_embeddings=max_positions, pad_token_id=ids[PAD],
                      bos_token_id=ids[BOS], eos_token_id=ids[EOS], tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream is not moved
        torch.manual_seed(seed)
        model: Any = LlamaForCausalLM(cfg)
        model = model.to(torch.float32).eval()
    model.generation_config = GenerationConfig(pad_token_id=ids[PAD], bos_token_id=ids[BOS],
                                               eos_token_id=ids[EOS])
    model.save_pretrained(str(out), safe_serialization=True)


class TokenCount:
    """A generate handler's batch state (``model.unit``), passed through, counting the tokens
    this process generated: the demo and ``benchmarks.generate`` show what a preemption cost.

    Every time the handler hands over the batch's tokens so far (at each checkpoint offer,
    where a pause parks, and at the batch's end) it rewrites ``tokens-PID`` in ``where`` with
    the tokens this process generated itself (restored ones not counted). Summed over the
    attempts, less the tokens published, that is the work done twice. :meth:`counted` is a
    hook for subclasses, called with the per-batch counts after each rewrite.
    """

    made: dict[str, int] = {}  # first request id of a batch -> tokens this process generated for it

    def __init__(self, unit: Any, where: str) -> None:
        self.unit, self.where = unit, where
        self.restored = sum(len(v["tokens"]) for v in unit.resumed.values())
        self.key = ""

    def get(self, rid: str) -> Any:
        return self.unit.get(rid)

    def update(self, entries: dict[str, Any]) -> None:
        self.unit.update(entries)
        self.key = self.key or min(entries)
        self.made[self.key] = sum(len(v["tokens"]) for v in self.unit.saved.values()) - self.restored
        tmp = os.path.join(self.where, f".tokens-{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(str(sum(self.made.values())))
        os.replace(tmp, os.path.join(self.where, f"tokens-{os.getpid()}"))
        self.counted(self.made)

    def offer(self) -> None:
        self.unit.offer()

    def counted(self, made: dict[str, int]) -> None:
        """Called after each rewrite of the count (nothing by default)."""

    @classmethod
    def attach(cls, model: Any, where: str) -> None:
        """Count the tokens of the batch ``model`` is about to generate (no-op without ``where``)."""
        if where and model.unit is not None and not isinstance(model.unit, cls):
            model.unit = cls(model.unit, where)
