"""Ray's serializers for other libraries' types, in segue's Ray processes, only for
libraries the process already imported.

Every Ray process builds its serialization context on its first call that
serializes anything (``ray.util.serialization_addons.apply``), and that imports
pyarrow, starlette and pydantic, when they are installed, to register
serializers for their types. segue's own traffic through Ray is plain data
(dicts, strings, bytes), yet the imports cost every process that speaks to
Ray about 0.4 CPU-s with all three installed (pyarrow with segue[data],
starlette and pydantic with segue[server]). An attempt on Ray has five such
processes on its path to its first record (the controller, the attempt's actor,
its worker, each sub-worker's actor): on two cores, a 2-worker map step's first
record came about 1 s later for them (benchmarks.scale's ``efficiency_2_workers``).

:func:`lean_serialization` makes this process's context register those
serializers only for the libraries it has imported already, so their objects
keep Ray's own serializers wherever they can occur; another object of theirs
still travels, by pickle, as any other type without a registered serializer
does. It is applied in segue's actors, which run no user code, and where
segue joins Ray (executor.ray.connect) in a process of its own: the CLI, a
detached controller, a worker (:func:`own_process`, said by their entry
points). A user's process that drives segue through its Python API keeps
Ray's serializers whole. A Ray whose internals differ from those expected
keeps its own behaviour.
"""

from __future__ import annotations

import sys
from typing import Any

_own = False  # set by segue's own entry points


def own_process() -> None:
    """Said by segue's entry points (the CLI, a detached controller, a worker): this
    process is segue's, and :func:`lean_if_own` may apply :func:`lean_serialization`."""
    global _own
    _own = True


def lean_if_own() -> bool:
    """:func:`lean_serialization` in a process of segue's own; False (untouched) elsewhere."""
    return lean_serialization() if _own else False


def _registrars(addons: Any) -> dict[str, Any] | None:
    """Ray's own registration function per library (by the module whose presence says
    a process uses it), or None where this Ray has others."""

    def pydantic(context: Any) -> None:
        from ray._common.pydantic_compat import register_pydantic_serializers

        register_pydantic_serializers(context)

    def pyarrow(context: Any) -> None:
        from ray._private.arrow_serialization import _register_custom_datasets_serializers

        _register_custom_datasets_serializers(context)

    starlette = getattr(addons, "register_starlette_serializer", None)
    if starlette is None:
        return None
    return {"pydantic": pydantic, "starlette": starlette, "pyarrow": pyarrow}


def lean_serialization() -> bool:
    """Apply the above to this process (once; before its first Ray call). False when
    this Ray has no such hook, and it keeps its own behaviour."""
    try:
        from ray.util import serialization_addons as addons
    except ImportError:
        return False
    original = getattr(addons, "apply", None)
    if original is None:
        return False
    if getattr(original, "segue_lean", False):
        return True
    registrars = _registrars(addons)
    if registrars is None:
        return False

    def apply(context: Any) -> None:
        try:
            for name, register in registrars.items():
                if name in sys.modules:
                    register(context)
        except (ImportError, AttributeError):  # another Ray inside: its own way, whole
            original(context)

    apply.segue_lean = True  # type: ignore[attr-defined]
    addons.apply = apply
    return True
