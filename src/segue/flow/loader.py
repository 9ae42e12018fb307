"""Load a flow from a ``.py`` file and fingerprint its code.

Loading executes the file (it is the user's own code, like ``python FLOW.py``),
then finds the single :class:`Flow` object it defines and validates its DAG.
Every problem becomes one :class:`FlowError` line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FlowError
from .model import Flow


@dataclass(frozen=True)
class LoadedFlow:
    flow: Flow
    path: Path
    order: list[str]
    fingerprint: dict[str, Any]


def fingerprint(flow: Flow, source: bytes) -> dict[str, Any]:
    """The code identity checked on resume: the file hash plus one hash per step."""
    return {
        "file": hashlib.sha256(source).hexdigest(),
        "steps": {name: spec.source_digest() for name, spec in flow.steps.items()},
    }


def changed_steps(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Names of steps whose code differs (added or removed steps included)."""
    a, b = old.get("steps", {}), new.get("steps", {})
    return sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))


def load_flow(path: str | Path) -> LoadedFlow:
    p = Path(path)
    try:
        is_file = p.is_file()
    except OSError as exc:  # e.g. a name too long: Path.is_file raises for it, not False
        raise FlowError(f"flow file path cannot be used ({exc.strerror}); pass the path of a .py file "
                        f"that defines a Flow") from None
    if not is_file:
        raise FlowError(f"flow file {str(p)!r} does not exist; pass the path of a .py file that defines a Flow")
    p = p.resolve()
    try:
        source = p.read_bytes()
    except OSError as exc:
        raise FlowError(f"flow file {str(path)!r} cannot be read ({exc.strerror}); "
                        f"check its permissions") from None
    try:
        compile(source, str(p), "exec")
    except SyntaxError as exc:
        raise FlowError(f"flow file {str(path)!r} line {exc.lineno}: {exc.msg}; fix the syntax and retry") from None
    except ValueError as exc:  # e.g. null bytes, on Pythons that do not call it a SyntaxError
        raise FlowError(f"flow file {str(path)!r} is not Python source ({exc}); pass a .py file") from None
    mod_name = "segue_flow_" + hashlib.sha256(str(p).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise FlowError(f"flow file {str(path)!r} cannot be imported; it must be a .py file")
    module = importlib.util.module_from_spec(spec)
    # The flow's own directory goes first on sys.path so it can import helpers
    # beside it, as `python FLOW.py` would allow.
    sys.path.insert(0, str(p.parent))
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except FlowError:
        raise
    except SystemExit as exc:
        # A script that exits on import would otherwise end `segue run` with
        # its code (often 0) having run nothing.
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise FlowError(
            f"flow file {str(path)!r} called sys.exit({exc.code!r}) at line {where.lineno} while "
            f"segue loaded it; put script code under `if __name__ == '__main__':`"
        ) from None
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise FlowError(
            f"flow file {str(path)!r} raised {type(exc).__name__} at line {where.lineno}: {exc}"
        ) from None
    finally:
        if sys.path and sys.path[0] == str(p.parent):
            sys.path.pop(0)
    flows = [v for v in vars(module).values() if isinstance(v, Flow)]
    if not flows:
        raise FlowError(f"flow file {str(path)!r} defines no segue.Flow; create one with Flow('name')")
    if len(flows) > 1:
        names = ", ".join(sorted(f.name for f in flows))
        raise FlowError(f"flow file {str(path)!r} defines several flows ({names}); keep one per file")
    flow = flows[0]
    order = flow.order()
    return LoadedFlow(flow=flow, path=p, order=order, fingerprint=fingerprint(flow, source))
