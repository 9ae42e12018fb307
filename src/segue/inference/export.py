"""Export a local Hugging Face text encoder to ONNX, for :class:`OnnxTextHandler`.

``export_onnx(model_dir, out_dir)`` traces ``AutoModel`` (its last hidden
state, with dynamic batch and sequence axes) with ``torch.onnx`` and copies
the fast tokenizer beside it. It needs torch and transformers once; the
handler that runs the result needs neither. The export is written to a
temporary directory and renamed into place, so a reader never sees half of
one, and an export of the same model files already there is kept.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .handlers._files import existing, files_identity

STAMP = "segue-export.json"


def export_onnx(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                opset: int = 17) -> Path:
    """``out_dir`` with ``model.onnx`` and ``tokenizer.json``; exported now unless an export
    of these very model files (names and sizes) is there already."""
    src = existing(model_dir, "export_onnx: model directory", directory=True)
    missing = [m for m in ("torch", "transformers", "onnx") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"export_onnx needs {', '.join(missing)}: pip install {' '.join(missing)}")
    if not (src / "tokenizer.json").is_file():
        raise UsageError(f"export_onnx: {src} has no tokenizer.json (a fast tokenizer is needed)")
    out = Path(out_dir).expanduser().resolve()
    stamp = {"source": files_identity(src), "opset": opset}
    if _stamp(out) == stamp:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _trace(src, tmp / "model.onnx", opset)
        shutil.copyfile(src / "tokenizer.json", tmp / "tokenizer.json")
        (tmp / STAMP).write_text(json.dumps(stamp, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _stamp(out: Path) -> Any:
    try:
        return json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _trace(src: Path, dest: Path, opset: int) -> None:
    import torch
    import transformers as tf

    tf.utils.logging.disable_progress_bar()  # one export, not a progress bar on the caller's terminal
    model = tf.AutoModel.from_pretrained(str(src), local_files_only=True).eval()
    tok = tf.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    sample = tok(["a first sentence", "and a second, longer one"], padding=True, return_tensors="pt")
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(**dict(zip(names, args, strict=True))).last_hidden_state

    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    # The TorchScript exporter announces its own deprecation and traces with warnings
    # that do not apply (a fixed-size trace of a dynamic model is what dynamic_axes undoes).
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(), tuple(sample[n] for n in names), str(dest), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=opset,
                          dynamo=False)
