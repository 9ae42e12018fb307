"""SentenceTransformerHandler: a ``sentence-transformers`` model from a local directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..handler import ModelHandler
from ._files import existing, files_identity


class SentenceTransformerHandler(ModelHandler[Any]):
    """``SentenceTransformer(path)`` on the device (offline); texts in, float32 NumPy rows out.

    Each call encodes the whole batch as one forward pass
    (``encode(batch_size=len(batch))``), so the batches segue cuts are the
    ones the model sees. ``normalize`` L2-normalises the embeddings.
    """

    def __init__(self, path: str | os.PathLike[str], *, normalize: bool = False, **options: Any) -> None:
        options.setdefault("name", "sentence-transformers")
        super().__init__(**options)
        self.path = existing(path, f"handler {self.name!r}: path", directory=True)
        self.normalize = normalize

    def load_model(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network at run time
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(self.path), device=self.resolve_device(), local_files_only=True)

    def run_inference(self, batch: Sequence[Any], model: Any) -> Sequence[Any]:
        vecs = model.encode(list(batch), batch_size=max(1, len(batch)), convert_to_numpy=True,
                            normalize_embeddings=self.normalize, show_progress_bar=False)
        return list(vecs)

    def config(self) -> dict[str, Any]:
        return {"files": files_identity(self.path), "normalize": self.normalize}
