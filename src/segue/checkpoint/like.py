"""A checkpoint's state tree against a template: ``restore(like=template)``.

The comparison reads the manifest only (its tree, and each array's shape and dtype
as recorded there), never a tensor byte, so a checkpoint saved by other code is
refused before anything large is read. Key paths are compared, and for arrays
(numpy, torch, JAX) the framework, shape and dtype. Leaves are compared by kind
only (number, str, bytes; bool, int, float and NumPy number scalars are all
numbers), never by value. ``None`` on either side matches anything: a template's
``None`` says "no value yet" (a best loss not seen, an EMA not started), and an
empty dict or list in the template matches any dict or list (a fresh optimizer's
``state`` is ``{}`` until its first step; a history grows). A dict, list or array
where the other side holds something else is a mismatch, and so is a value pickled
with ``allow_pickle`` whose type is not the template's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._lazy import numpy_on_first_use
from ..errors import CheckpointMismatchError
from . import _jax, _stateful, _torch
from .format import Manifest
from .tree import TAG, _type_name

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy_on_first_use(globals())

_SEQ_TAGS = ("tuple",)
_ARRAY_TAGS = {"ndarray": "numpy array", "tensor": "torch tensor", "jax": "jax array"}
_WILDCARD = object()


def mismatches(manifest: Manifest, template: Any, *, node: Any = _WILDCARD) -> list[str]:
    """Every difference between ``node`` (a part of ``manifest.tree``; the whole tree by
    default) and ``template``, in tree order; empty when they match."""
    out: list[str] = []
    _Compare(manifest, out).value(manifest.tree if node is _WILDCARD else node, template, "")
    return out


def check(manifest: Manifest, template: Any, *, name: str, fix: str, node: Any = _WILDCARD) -> None:
    """Raise :class:`~segue.errors.CheckpointMismatchError` naming checkpoint ``name``
    and the first differences (then ``fix``), unless the tree matches ``template``."""
    found = mismatches(manifest, template, node=node)
    if found:
        raise CheckpointMismatchError(name, found, fix)


def _join(path: str, key: Any) -> str:
    if type(key) is str:
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape))


class _Compare:
    def __init__(self, manifest: Manifest, out: list[str]) -> None:
        self.m, self.out = manifest, out

    def miss(self, path: str, what: str) -> None:
        self.out.append(f"{path or 'the state'} {what}")

    def value(self, node: Any, tmpl: Any, path: str) -> None:
        if tmpl is None or node is None:
            return  # "no value yet", on either side
        sd = _stateful.state_of(tmpl)  # a loader is saved as its state_dict()
        if sd is not None:
            tmpl = sd
        want = _template_kind(tmpl)
        have = _node_kind(node)
        if want in ("mapping", "sequence") and want == have and len(tmpl) == 0:
            return  # contents not known yet: a fresh optimizer's state, an empty history
        if want == "mapping" and have == "mapping":
            self.mapping(_node_items(node), tmpl, path)
        elif want == "sequence" and have == "sequence":
            self.sequence(node["items"] if isinstance(node, dict) else node, tmpl, path)
        elif want == "array" and have == "array":
            self.array(node, tmpl, path)
        elif have == "object":  # pickled (allow_pickle): its type must be the template's
            saved = self.m.opaque[node["ref"]].type if node.get("ref") in self.m.opaque else "?"
            if saved != _type_name(tmpl):
                self.miss(path, f"{saved} != {_type_name(tmpl)}")
        elif have != want and "unknown" not in (have, want):
            self.miss(path, f"{self.describe(node, have)} != {_describe_template(tmpl, want)}")

    def mapping(self, items: Mapping[Any, Any], tmpl: Mapping[Any, Any], path: str) -> None:
        for key, sub in tmpl.items():
            if key in items:
                self.value(items[key], sub, _join(path, key))
            else:
                self.miss(_join(path, key), "missing")
        for key in items:
            if key not in tmpl:
                self.miss(_join(path, key), "not in the template")

    def sequence(self, items: list[Any], tmpl: Any, path: str) -> None:
        if len(items) != len(tmpl):
            self.miss(path, f"length {len(items)} != {len(tmpl)}")
        for i, (node, sub) in enumerate(zip(items, tmpl, strict=False)):
            self.value(node, sub, _join(path, i))

    def array(self, node: dict[str, Any], tmpl: Any, path: str) -> None:
        entry = self.m.arrays.get(node.get("ref", ""))
        if entry is None:
            return  # a malformed tree: load reports it as corrupt
        saved_kind, want_kind = _ARRAY_TAGS[node[TAG]], _array_kind(tmpl)
        if saved_kind != want_kind:
            self.miss(path, f"{saved_kind} != {want_kind}")
            return
        if tuple(entry.shape) != tuple(tmpl.shape):
            self.miss(path, f"shape {_shape(entry.shape)} != {_shape(tuple(tmpl.shape))}")
        saved_dtype = str(entry.meta.get("dtype") or np.dtype(entry.dtype).name)
        if saved_dtype != _dtype_name(tmpl):
            self.miss(path, f"dtype {saved_dtype} != {_dtype_name(tmpl)}")

    def describe(self, node: Any, kind: str) -> str:
        if kind == "array":
            entry = self.m.arrays.get(node.get("ref", ""))
            shape = f" {_shape(entry.shape)}" if entry is not None else ""
            return f"{_ARRAY_TAGS[node[TAG]]}{shape}"
        if kind == "object":
            ref = node.get("ref")
            return self.m.opaque[ref].type if ref in self.m.opaque else "a pickled value"
        return {"mapping": "dict", "sequence": "list"}.get(kind, kind)


def _node_kind(node: Any) -> str:
    if isinstance(node, list):
        return "sequence"
    if isinstance(node, bool | int | float):
        return "number"
    if isinstance(node, str):
        return "str"
    if not isinstance(node, dict):
        return "unknown"
    tag = node.get(TAG)
    if tag is None or tag in ("odict", "idict"):
        return "mapping"
    if tag in _SEQ_TAGS:
        return "sequence"
    if tag in _ARRAY_TAGS:
        return "array"
    if tag == "float":
        return "number"
    if tag == "bytes":
        return "bytes"
    if tag == "npscalar":
        return {"U": "str", "S": "bytes"}.get(str(node.get("dtype")), "number")
    if tag == "generator":
        return "generator"
    if tag == "pickle":
        return "object"
    return "unknown"  # a newer segue's tag: load decides


def _node_items(node: dict[str, Any]) -> Mapping[Any, Any]:
    tag = node.get(TAG)
    if tag == "odict":
        items: Mapping[Any, Any] = node["items"]
        return items
    if tag == "idict":
        return dict(zip(node["keys"], node["values"], strict=False))
    return node


def _template_kind(v: Any) -> str:
    if isinstance(v, Mapping):
        return "mapping"
    if isinstance(v, list | tuple):
        return "sequence"
    if isinstance(v, bool | int | float):
        return "number"
    if isinstance(v, str):
        return "str"
    if isinstance(v, bytes):
        return "bytes"
    npm = sys.modules.get("numpy")
    if npm is not None:
        if isinstance(v, npm.ndarray):
            return "array"
        if isinstance(v, npm.str_):
            return "str"
        if isinstance(v, npm.bytes_):
            return "bytes"
        if isinstance(v, npm.generic):
            return "number"
        if isinstance(v, npm.random.Generator):
            return "generator"
    if _torch.is_tensor(v) or _jax.is_array(v):
        return "array"
    return "object"


def _array_kind(v: Any) -> str:
    if _torch.is_tensor(v):
        return "torch tensor"
    if _jax.is_array(v):
        return "jax array"
    return "numpy array"


def _dtype_name(v: Any) -> str:
    if _torch.is_tensor(v):
        return str(v.dtype).removeprefix("torch.")
    dtype = v.dtype
    return str(getattr(dtype, "name", dtype))


def _describe_template(v: Any, kind: str) -> str:
    if kind == "array":
        return f"{_array_kind(v)} {_shape(tuple(v.shape))}"
    if kind == "mapping":
        return "dict"
    if kind == "sequence":
        return "list"
    if kind == "object":
        return _type_name(v)
    return kind
