"""Byte sizes, read and written one way everywhere: GB is 10**9 bytes, GiB is 2**30.

:func:`parse_bytes` reads what a user types (``--gpu-mem 80GB``, ``gpu_memory="40GiB"``,
``pool set --memory 64GiB``, a JSON body's ``"96GB"``) and :func:`format_bytes` /
:func:`in_unit` write figures with the unit they were computed in. The two systems are
never mixed: ``80GB`` is 80,000,000,000 bytes and prints as ``80.00 GB`` (or
``74.51 GiB``), never as 85.90 GB.

Accepted spellings (case-insensitive, a space before the unit allowed)::

    123          bytes (an int, or a string of digits)
    B            bytes
    kB MB GB TB PB          decimal (SI):  10**3 10**6 10**9 10**12 10**15
    K  M  G  T  P           the same, as Kubernetes writes them
    KiB MiB GiB TiB PiB     binary (IEC):  2**10 2**20 2**30 2**40 2**50
    Ki  Mi  Gi  Ti  Pi      the same, as Kubernetes writes them

The number may have a fraction (``1.5GB``); the result is rounded down to a whole
byte. This module sits at the bottom of segue's layers: it imports nothing from
segue, so flows, the scheduler, the planner and the CLI can all use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

__all__ = ["MAX_BYTES", "SPELLINGS", "UNITS", "SizeError", "format_bytes", "in_unit", "parse_bytes"]

MAX_BYTES = 2**63 - 1  # a store column holds 64 signed bits

DECIMAL: dict[str, int] = {"kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
BINARY: dict[str, int] = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
UNITS: dict[str, int] = {"B": 1, **DECIMAL, **BINARY}
# Every accepted suffix, upper-cased, to its scale ("" is a plain number of bytes).
_SCALE: dict[str, int] = {"": 1, "B": 1}
for _name, _n in {**DECIMAL, **BINARY}.items():
    _SCALE[_name.upper()] = _n
    _SCALE[_name.upper().removesuffix("B")] = _n  # K, M, G, Ki, Mi, Gi, ...

SPELLINGS = "B, kB, MB, GB, TB (10^3..10^12), KiB, MiB, GiB, TiB (2^10..2^40)"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


class SizeError(ValueError):
    """A value that is not a byte size; the message lists the accepted spellings."""


def parse_bytes(value: str | int, what: str = "size", *,
                error: Callable[[str], Exception] = SizeError) -> int:
    """``'80GB'`` -> 80_000_000_000, ``'80GiB'`` -> 85_899_345_920, ``4096`` -> 4096.

    Anything else raises ``error(message)`` (default :class:`SizeError`, a
    ``ValueError``): one line naming ``what``, the value and the accepted units. A
    caller with an exception tree of its own passes its class (segue's layers pass
    ``UsageError`` so the CLI exits 2).
    """
    def bad(why: str = "") -> Exception:
        return error(f"{what} must be a size such as 80GB (10^9 bytes), 80GiB (2^30 bytes), 512MiB "
                     f"or a number of bytes{why}, not {value!r}; units: {SPELLINGS}")

    if isinstance(value, bool):
        raise bad()
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if not m or m.group(2).upper() not in _SCALE:
            raise bad()
        size = math.floor(Fraction(m.group(1)) * _SCALE[m.group(2).upper()])
    else:
        raise bad()
    if not 0 <= size <= MAX_BYTES:
        raise bad(" from 0 to 8 EiB")
    return size


def in_unit(n: float, unit: str, digits: int = 2) -> str:
    """``n`` bytes in one fixed ``unit`` (``GB``, ``GiB``, ``MB``, ...): ``'80.00 GB'``."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    return f"{n / UNITS[unit]:.{digits}f} {unit}"


def format_bytes(n: float, *, binary: bool = False, digits: int = 1) -> str:
    """``n`` bytes in the largest unit below it of one system: decimal (``'1.2 MB'``, as
    disks, GPUs' datasheets and this planner count) or ``binary`` (``'1.1 MiB'``)."""
    units = BINARY if binary else DECIMAL
    step = 1024 if binary else 1000
    if abs(n) < step:
        return f"{n:.0f} B"
    # the largest unit whose value stays below the next step (the last unit has no ceiling)
    name = next((u for u, scale in units.items() if abs(n) < scale * step), list(units)[-1])
    return f"{n / units[name]:.{digits}f} {name}"
