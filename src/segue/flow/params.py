"""Parse and validate ``--param k=v`` overrides against a flow's typed parameters.

Validation happens before anything is written, so a bad value costs nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from .._canon import canonical_json
from ..errors import ParamError
from .model import Param

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a finite number")  # json.loads accepts NaN and Infinity


def check_storable(name: str, value: Any) -> Any:
    """A parameter is stored as canonical JSON: finite numbers, valid text, plain containers.

    Checked before anything is written, so ``nan`` or ``inf`` is bad input
    (exit 2), not a failure of the store after the home was created.
    """
    try:
        canonical_json(value).encode("utf-8")
    except (ValueError, TypeError, UnicodeError, RecursionError):
        raise ParamError(
            f"parameter {name!r} = {value!r} cannot be stored; use finite numbers, text, and "
            f"lists or dicts of them (no nan, inf or undecodable bytes)"
        ) from None
    return value


def _convert(name: str, kind: type, raw: str) -> Any:
    try:
        if kind is bool:
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if kind is int:
            return int(raw)
        if kind is float:
            value = float(raw)
            if not math.isfinite(value):
                raise ParamError(
                    f"parameter {name!r} must be a finite float, got {raw!r}; pass a number such "
                    f"as --param {name}=0.5"
                )
            return value
        if kind is str:
            return raw
        value = json.loads(raw, parse_constant=_no_constant)
        if not isinstance(value, kind):
            raise ValueError
        return value
    except (ValueError, RecursionError):
        raise ParamError(
            f"parameter {name!r} expects {kind.__name__}, got {raw!r}; pass --param {name}=<{kind.__name__}>"
        ) from None


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """['a=1', 'b=x'] -> {'a': '1', 'b': 'x'}."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ParamError(f"--param {item!r} must look like name=value")
        out[key.strip()] = value
    return out


def resolve(declared: Mapping[str, Param], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with overrides (strings are converted, typed values checked)."""
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise ParamError(f"unknown parameter {unknown[0]!r}; this flow's parameters: {known}")
    values: dict[str, Any] = {}
    for name, p in declared.items():
        if name not in overrides:
            values[name] = p.default
            continue
        raw = overrides[name]
        kind = p.kind
        if isinstance(raw, str) and kind is not str:
            values[name] = _convert(name, kind, raw)
        elif kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            values[name] = float(raw)
        elif not isinstance(raw, kind) or (kind is int and isinstance(raw, bool)):
            raise ParamError(f"parameter {name!r} expects {kind.__name__}, got {raw!r}")
        else:
            values[name] = raw
    for name, value in values.items():
        check_storable(name, value)
    return values
