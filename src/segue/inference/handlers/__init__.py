"""Ready model handlers. Each imports its library only when it loads its model.

=========================== ============================ ==================
handler                     model                        extra
=========================== ============================ ==================
:class:`PytorchModelHandler` a ``torch.nn.Module`` class + safetensors weights  ``segue[torch]``
:class:`TransformersHandler` ``AutoModel``/``AutoTokenizer`` from a local directory  ``segue[hf]``
:class:`SentenceTransformerHandler` a sentence-transformers directory          ``segue[hf]``
:class:`OnnxModelHandler`   an ``.onnx`` file on ONNX Runtime                  ``segue[onnx]``
:class:`OnnxTextHandler`    a text encoder exported to ONNX, with its tokenizer ``segue[onnx]``
:class:`TransformersGenerateHandler` a causal LM directory: batch generation  ``segue[hf]``
:class:`VLLMHandler`        a causal LM on vLLM's offline engine (GPU)         ``segue[vllm]``
=========================== ============================ ==================
"""

from __future__ import annotations

from .generate import TransformersGenerateHandler
from .onnx_text import OnnxTextHandler
from .onnxrt import OnnxModelHandler
from .pytorch import PytorchModelHandler
from .sbert import SentenceTransformerHandler
from .transformers_hf import TransformersHandler
from .vllm import VLLMHandler

__all__ = ["OnnxModelHandler", "OnnxTextHandler", "PytorchModelHandler", "SentenceTransformerHandler",
           "TransformersGenerateHandler", "TransformersHandler", "VLLMHandler"]
