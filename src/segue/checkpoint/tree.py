"""A state tree to (JSON tree, arrays, opaque blobs) and back, exactly.

JSON holds dicts with str keys, lists, str, int, finite floats, bool and None.
Everything else is a tagged dict ``{"__segue__": <tag>, ...}``: tuples, nan/inf,
bytes, numpy scalars, numpy generators, and references to arrays (stored in the
tensor file) or to pickled blobs. A data loader or sampler (``_stateful``) is stored
as its ``state_dict()`` and comes back as that dict. Pickle is used only when the caller passes
``allow_pickle=True``; decoding never unpickles otherwise. Types are matched
exactly so that what comes back is what went in; anything else raises
:class:`~segue.errors.StateTypeError` naming where it is in the tree.
"""

from __future__ import annotations

import base64
import math
import pickle
import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._lazy import numpy_on_first_use
from ..errors import CheckpointError, StateTypeError
from . import _jax, _stateful, _torch

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy_on_first_use(globals())  # only array states need it: see segue._lazy

TAG = "__segue__"
GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_FIX = (
    "checkpoints store dicts, lists, tuples, scalars, strings, bytes and arrays; "
    "convert it, or pass allow_pickle=True to save and load"
)


class MalformedTreeError(ValueError):
    """The stored tree does not decode (unknown tag, missing reference)."""


@dataclass
class Encoded:
    tree: Any
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    array_meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    opaque: dict[str, bytes] = field(default_factory=dict)
    opaque_types: dict[str, str] = field(default_factory=dict)
    layout: list[tuple[Any, ...]] = field(default_factory=list)
    """Per array, in ref order: what its place in the blobs depends on (dtype, shape,
    meta), never its content. Equal layouts plan into equal blob layouts, so a
    checkpointer saving the same structure again can reuse the plan (``blobs.plan``)."""


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# Paths are built only when an error names one: a (parent, suffix) chain costs a tuple
# per node, where an f-string per key cost more than the encoding itself on states
# with thousands of small arrays.
Path = Any  # str (the root), (Path, suffix) or (Path, dict key, None)


def _render(path: Path) -> str:
    parts: list[str] = []
    while isinstance(path, tuple):
        parts.append(path[1] if len(path) == 2 else f"[{path[1]!r}]")
        path = path[0]
    return str(path) + "".join(reversed(parts))


_NUMPY_META = ("numpy",)


class _Encoder:
    def __init__(self, allow_pickle: bool) -> None:
        # Looked up once per encode, not per value: a value of a NumPy type means NumPy
        # was imported before the encode began; a JSON state never imports it.
        self.npm: Any = sys.modules.get("numpy")
        self.allow_pickle = allow_pickle
        self.out = Encoded(tree=None)

    def array(self, arr: np.ndarray, meta: dict[str, Any] | None) -> str:
        """Add ``arr`` (C-contiguous from here on); ``meta`` None means a numpy array."""
        out = self.out
        ref = f"a{len(out.arrays)}"
        # Keep 0-d arrays 0-d: np.ascontiguousarray would make them 1-d.
        out.arrays[ref] = arr if arr.flags.c_contiguous else arr.copy(order="C")
        if meta is None:
            out.array_meta[ref] = {"framework": "numpy"}
            key: tuple[str, ...] = _NUMPY_META
        else:
            out.array_meta[ref] = meta
            key = tuple(sorted(map(repr, meta.items())))
        out.layout.append((arr.dtype, arr.shape, key))  # dtypes compare by value
        return ref

    def opaque(self, value: Any, path: Path, why: str) -> dict[str, Any]:
        if not self.allow_pickle:
            raise StateTypeError(f"{_render(path)} {why}; {_FIX}")
        try:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise StateTypeError(
                f"{_render(path)} holds a {_type_name(value)} that pickle cannot store ({e}); "
                "convert it"
            ) from None
        ref = f"o{len(self.out.opaque)}"
        self.out.opaque[ref] = blob
        self.out.opaque_types[ref] = _type_name(value)
        return {TAG: "pickle", "ref": ref}

    def encode(self, v: Any, path: Path) -> Any:
        t = type(v)
        if v is None or t is bool or t is int or t is str:
            return v
        npm = self.npm
        if npm is not None and t is npm.ndarray:  # first: states are mostly arrays
            if v.dtype.hasobject or v.dtype.kind == "V":
                return self.opaque(v, path, f"holds an array of dtype {v.dtype}")
            return {TAG: "ndarray", "ref": self.array(v, None)}
        if t is float:
            return v if math.isfinite(v) else {TAG: "float", "value": repr(v)}
        if t is dict or t is OrderedDict:
            return self.mapping(v, path)
        if t is list:
            return [self.encode(x, (path, f"[{i}]")) for i, x in enumerate(v)]
        if t is tuple:
            return {
                TAG: "tuple",
                "items": [self.encode(x, (path, f"[{i}]")) for i, x in enumerate(v)],
            }
        if t is bytes:
            return {TAG: "bytes", "b64": base64.b64encode(v).decode("ascii")}
        if npm is not None:
            found = self._numpy_value(npm, v, t, path)
            if found is not None:
                return found
        if _torch.is_tensor(v):
            host = _torch.to_numpy(v)
            if host is None:
                return self.opaque(
                    v, path, f"holds a tensor of dtype {v.dtype}, which numpy cannot hold"
                )
            return {TAG: "tensor", "ref": self.array(*host)}
        if _jax.is_array(v):
            host = _jax.to_numpy(v)
            if host is None:
                return self.opaque(v, path, f"holds a sharded or {v.dtype} JAX array")
            return {TAG: "jax", "ref": self.array(*host)}
        sd = _stateful.state_of(v)  # a data loader or sampler: its state_dict() is its state
        if sd is not None:
            return self.encode(sd, (path, ".state_dict()"))
        return self.opaque(v, path, f"holds a {_type_name(v)}")

    def _numpy_value(self, npm: Any, v: Any, t: type, path: Path) -> Any:
        """The encoding of a NumPy scalar or Generator, or None if ``v`` is neither."""
        if t is npm.str_:  # flexible scalars: their dtype size follows the value
            return {TAG: "npscalar", "dtype": "U", "value": str(v)}
        if t is npm.bytes_:
            return {TAG: "npscalar", "dtype": "S", "b64": base64.b64encode(v).decode("ascii")}
        if isinstance(v, npm.generic) and not (v.dtype.hasobject or v.dtype.kind == "V"):
            return {
                TAG: "npscalar",
                "dtype": v.dtype.str,
                "b64": base64.b64encode(v.tobytes()).decode("ascii"),
            }
        if t is npm.random.Generator and type(v.bit_generator).__name__ in GENERATORS:
            state = self.encode(v.bit_generator.state, (path, ".bit_generator.state"))
            return {
                TAG: "generator",
                "bit_generator": type(v.bit_generator).__name__,
                "state": state,
            }
        return None

    def mapping(self, d: dict[Any, Any], path: Path) -> Any:
        if d and type(d) is dict and all(type(k) is int for k in d):
            # int keys (an optimizer's per-parameter state): JSON keys must be str
            return {
                TAG: "idict",
                "keys": list(d),
                "values": [self.encode(x, (path, f"[{k!r}]")) for k, x in d.items()],
            }
        for k in d:
            if type(k) is not str:
                return self.opaque(
                    d,
                    path,
                    f"has a key of type {_type_name(k)} ({k!r}); checkpoint dicts need str keys",
                )
        if TAG in d:
            return self.opaque(d, path, f"has the key {TAG!r}, which segue reserves; rename it")
        enc, array = self.encode, self.array
        nd = self.npm.ndarray if self.npm is not None else None
        items = {}
        for k, x in d.items():
            # A NumPy array of plain values (a model's weights, by the thousand) goes
            # straight to array(), as encode() would send it: one call a leaf, not two.
            # Any other value, and an array encode() stores opaque, goes through encode().
            if type(x) is nd and not (x.dtype.hasobject or x.dtype.kind == "V"):
                items[k] = {TAG: "ndarray", "ref": array(x, None)}
            else:
                items[k] = enc(x, (path, k, None))
        return items if type(d) is dict else {TAG: "odict", "items": items}


def encode(state: Any, *, allow_pickle: bool = False) -> Encoded:
    """Split ``state`` into a JSON tree, host arrays and (only if allowed) pickled blobs."""
    enc = _Encoder(allow_pickle)
    _torch.begin_encode()
    enc.out.tree = enc.encode(state, "state")
    return enc.out


class _Decoder:
    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        array_meta: Mapping[str, dict[str, Any]],
        opaque: Mapping[str, bytes],
        allow_pickle: bool,
    ) -> None:
        self.arrays, self.array_meta = arrays, array_meta
        self.opaque, self.allow_pickle = opaque, allow_pickle

    def array(self, node: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        ref = node.get("ref")
        if not isinstance(ref, str) or ref not in self.arrays:
            raise MalformedTreeError(f"array reference {ref!r} is not in the checkpoint")
        return self.arrays[ref], dict(self.array_meta.get(ref, {}))

    def decode(self, v: Any, path: str) -> Any:
        if isinstance(v, list):
            return [self.decode(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if not isinstance(v, dict):
            return v
        if TAG not in v:
            return {k: self.decode(x, f"{path}[{k!r}]") for k, x in v.items()}
        try:
            return self.tagged(v, path)
        except (MalformedTreeError, CheckpointError):
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedTreeError(f"{path}: malformed {v.get(TAG)!r} node ({e})") from None

    def tagged(self, v: dict[str, Any], path: str) -> Any:
        tag = v[TAG]
        if tag == "tuple":
            return tuple(self.decode(x, f"{path}[{i}]") for i, x in enumerate(v["items"]))
        if tag == "idict":
            keys = v["keys"]
            if not all(type(k) is int for k in keys) or len(keys) != len(v["values"]):
                raise MalformedTreeError(f"{path}: malformed 'idict' node")
            return {k: self.decode(x, f"{path}[{k!r}]") for k, x in zip(keys, v["values"], strict=True)}
        if tag == "odict":
            return OrderedDict((k, self.decode(x, f"{path}[{k!r}]")) for k, x in v["items"].items())
        if tag == "float":
            if v["value"] not in ("nan", "inf", "-inf"):
                raise MalformedTreeError(f"{path}: bad float {v['value']!r}")
            return float(v["value"])
        if tag == "bytes":
            return base64.b64decode(v["b64"], validate=True)
        if tag == "npscalar":
            if v["dtype"] == "U":
                return np.str_(v["value"])
            if v["dtype"] == "S":
                return np.bytes_(base64.b64decode(v["b64"], validate=True))
            dt = np.dtype(v["dtype"])
            if dt.hasobject:
                raise MalformedTreeError(f"{path}: object dtype in a numpy scalar")
            return np.frombuffer(base64.b64decode(v["b64"], validate=True), dtype=dt)[0]
        if tag == "ndarray":
            return self.array(v)[0]
        if tag == "tensor":
            return _torch.from_numpy(*self.array(v))
        if tag == "jax":
            return _jax.from_numpy(*self.array(v))
        if tag == "generator":
            if v["bit_generator"] not in GENERATORS:
                raise MalformedTreeError(f"{path}: unknown bit generator {v['bit_generator']!r}")
            bit_gen = getattr(np.random, v["bit_generator"])()
            bit_gen.state = self.decode(v["state"], f"{path}.bit_generator.state")
            return np.random.Generator(bit_gen)
        if tag == "pickle":
            return self.unpickle(v, path)
        raise MalformedTreeError(f"{path}: unknown tag {tag!r}; a newer segue may have written it")

    def unpickle(self, v: dict[str, Any], path: str) -> Any:
        ref = v["ref"]
        if not self.allow_pickle:
            raise StateTypeError(
                f"{path} was saved with pickle; loading it runs code from the checkpoint, "
                "so pass allow_pickle=True to load if you trust its source"
            )
        if ref not in self.opaque:
            raise MalformedTreeError(f"{path}: pickled blob {ref!r} is not in the checkpoint")
        return pickle.loads(self.opaque[ref])  # reached only with allow_pickle=True (checked above)


def decode(
    tree: Any,
    arrays: Mapping[str, np.ndarray],
    array_meta: Mapping[str, dict[str, Any]],
    opaque: Mapping[str, bytes],
    *,
    allow_pickle: bool = False,
) -> Any:
    """Rebuild the state that :func:`encode` split; unpickles only with ``allow_pickle``."""
    return _Decoder(arrays, array_meta, opaque, allow_pickle).decode(tree, "state")
