"""segue.executor.ray_lean: Ray's serializers for other libraries, only for those already imported.

Each case runs in a fresh interpreter (what a process has imported is the
point), and hands Ray's own ``serialization_addons.apply`` a context that
records what it is asked to register. The end-to-end proof, on a cluster, is
in test_ray_executor (no pyarrow in segue's Ray processes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="needs Ray: pip install 'segue[ray]'")

PROBE = """
import json, sys
{before}
from segue.executor.ray_lean import lean_serialization
applied = lean_serialization() if {lean} else None
from ray.util import serialization_addons

class Recorder:
    def __init__(self):
        self.types = []
    def _register_cloudpickle_serializer(self, cls, **kw):
        self.types.append(cls.__module__.split(".")[0])
    def __getattr__(self, name):  # any other registration Ray makes
        return lambda *a, **kw: self.types.append(name)

r = Recorder()
serialization_addons.apply(r)
print(json.dumps({{"applied": applied, "registered": sorted(set(r.types)),
                  "imported": [m for m in ("pyarrow", "starlette", "pydantic") if m in sys.modules]}}))
"""


def probe(before: str = "", lean: bool = True) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before, lean=lean)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_process_that_never_imported_them_imports_none_of_them() -> None:
    pytest.importorskip("pyarrow", reason="the premise: Ray would import pyarrow")
    got = probe()
    assert got == {"applied": True, "registered": [], "imported": []}


def test_a_process_that_uses_pyarrow_keeps_rays_serializers_for_it() -> None:
    pytest.importorskip("pyarrow", reason="needs pyarrow")
    got = probe("import pyarrow")
    assert got["applied"] is True
    assert "pyarrow" in got["registered"], got
    assert got["imported"] == ["pyarrow"], got  # and still not starlette or pydantic


def test_without_the_lean_hook_ray_imports_them_all() -> None:
    """The control: Ray's own apply, on the same recorder, does import pyarrow."""
    pytest.importorskip("pyarrow", reason="the premise: Ray would import pyarrow")
    got = probe(lean=False)
    assert "pyarrow" in got["imported"] and "pyarrow" in got["registered"], got


OWNER = """
import json
from ray.util import serialization_addons
from segue.executor import ray_lean
before = serialization_addons.apply
user = ray_lean.lean_if_own()  # a user's process (the Python API): untouched
untouched = serialization_addons.apply is before
ray_lean.own_process()  # what segue's entry points say
own = ray_lean.lean_if_own()
hook = serialization_addons.apply
print(json.dumps({"user": user, "untouched": untouched, "own": own, "replaced": hook is not before,
                  "once": ray_lean.lean_if_own() and serialization_addons.apply is hook}))
"""


def test_only_segues_own_processes_are_made_lean() -> None:
    out = subprocess.run([sys.executable, "-c", OWNER], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"user": False, "untouched": True, "own": True, "replaced": True, "once": True}
