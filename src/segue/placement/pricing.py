"""What devices cost: a catalog of device types, their default hourly prices, and the
operator's own prices kept in ``HOME/prices.json``.

Accounting (``scheduler.accounting``) counts resource-seconds per device *type*;
this module turns them into money at display time, so changing a price re-prices
every run, and ``cost = resource-hours x price`` holds exactly.

The defaults are indicative on-demand list prices (USD) of large clouds; they
are there so that a fresh install shows a plausible order of magnitude. Set
your own with ``segue prices set KEY USD``. Virtual GPUs cost nothing by
default: they are a scheduling fiction on a machine without GPUs.

This module never reads the store; it owns the prices file only.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

PRICES_FILE = "prices.json"
PRICES_VERSION = 1
HOURS_PER_MONTH = 730.0  # the cloud billing convention (8760 h / 12)
CPU = "cpu"  # priced per core-hour
STORAGE = "storage"  # priced per GB-month (10^9 bytes)
UNKNOWN_GPU = "gpu"  # the price of a GPU whose type is not in the catalog and has no price of its own
VIRTUAL = "virtual"


@dataclass(frozen=True)
class Entry:
    key: str
    label: str
    unit: str  # "device-hour" | "core-hour" | "GB-month"
    usd: float  # default price per unit


CATALOG: tuple[Entry, ...] = (
    Entry("rtx-pro-6000-blackwell", "NVIDIA RTX PRO 6000 Blackwell", "device-hour", 2.50),
    Entry("l4", "NVIDIA L4", "device-hour", 0.71),
    Entry("a100-40gb", "NVIDIA A100 40GB", "device-hour", 3.67),
    Entry("a100-80gb", "NVIDIA A100 80GB", "device-hour", 5.07),
    Entry("h100", "NVIDIA H100", "device-hour", 9.80),
    Entry("h200", "NVIDIA H200", "device-hour", 10.60),
    Entry("b200", "NVIDIA B200", "device-hour", 14.00),
    Entry(VIRTUAL, "virtual GPU (configured with `segue pool set`)", "device-hour", 0.0),
    Entry(UNKNOWN_GPU, "any other GPU without a price of its own", "device-hour", 2.50),
    Entry(CPU, "CPU core", "core-hour", 0.04),
    Entry(STORAGE, "checkpoint storage", "GB-month", 0.02),
)
DEFAULTS: dict[str, float] = {e.key: e.usd for e in CATALOG}

_KEY = re.compile(r"^[a-z0-9][a-z0-9.-]{0,63}$")

# Matched in order against the lower-cased device name: the first hit wins, so
# the more specific names come first.
_RULES: tuple[tuple[str, str], ...] = (
    ("rtx pro 6000", "rtx-pro-6000-blackwell"),
    ("b200", "b200"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("l4", "l4"),
)


def device_type(name: str, memory: int, virtual: bool) -> str:
    """The catalog key of a device, or a slug of its name for a GPU the catalog lacks."""
    if virtual:
        return VIRTUAL
    low = name.lower()
    if "a100" in low:
        # NVML names the size ("A100-SXM4-80GB"); else the memory decides.
        if "80gb" in low or ("40gb" not in low and memory > 48 * 2**30):
            return "a100-80gb"
        return "a100-40gb"
    for needle, key in _RULES:
        if re.search(rf"(^|[^a-z0-9]){re.escape(needle)}($|[^a-z0-9])", low):
            return key
    slug = re.sub(r"[^a-z0-9]+", "-", low.replace("nvidia", "")).strip("-")
    return slug[:64] or UNKNOWN_GPU


def check_price(key: str, usd: float) -> tuple[str, float]:
    if not _KEY.match(key):
        raise UsageError(f"price key {key!r} is invalid; use a catalog key "
                         f"({', '.join(DEFAULTS)}) or a lower-case device slug")
    if not math.isfinite(usd) or usd < 0:
        raise UsageError(f"price of {key!r} must be a finite number >= 0, not {usd!r}")
    return key, float(usd)


def parse_price(text: str) -> tuple[str, float]:
    """``KEY=USD`` (the ``--price`` flag)."""
    key, sep, val = text.partition("=")
    if not sep:
        raise UsageError(f"--price {text!r} must look like KEY=USD, e.g. h100=9.80")
    try:
        usd = float(val)
    except ValueError:
        raise UsageError(f"--price {text!r}: {val!r} is not a number") from None
    return check_price(key.strip(), usd)


def _path(home_root: Path) -> Path:
    return home_root / PRICES_FILE


def load_overrides(home_root: Path) -> dict[str, float]:
    """The operator's prices from the home (empty when none were set)."""
    p = _path(home_root)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{p} is unreadable ({exc}); fix or delete it, then set prices again "
                         "with `segue prices set`") from None
    if not isinstance(doc, dict) or doc.get("version") != PRICES_VERSION or not isinstance(
            doc.get("usd"), dict):
        raise UsageError(f"{p} is not a version-{PRICES_VERSION} prices file; delete it and set "
                         "prices again with `segue prices set`")
    return dict(check_price(str(k), float(v)) for k, v in doc["usd"].items())


def save_overrides(home_root: Path, usd: Mapping[str, float]) -> None:
    """Atomically replace the prices file (temp file, fsync, rename, fsync the directory)."""
    from .._atomic import write_atomic

    home_root.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"version": PRICES_VERSION, "usd": dict(sorted(usd.items()))}, indent=1)
    write_atomic(_path(home_root), data.encode(), mode=0o600)


@dataclass(frozen=True)
class Prices:
    usd: Mapping[str, float]  # defaults overlaid with the home's prices and the --price flags

    @classmethod
    def resolve(cls, home_root: Path | None = None,
                flags: Mapping[str, float] | None = None) -> Prices:
        merged = dict(DEFAULTS)
        if home_root is not None:
            merged.update(load_overrides(home_root))
        merged.update(flags or {})
        return cls(merged)

    def per_hour(self, key: str) -> float:
        """USD per device-hour (or per core-hour for ``cpu``)."""
        return self.usd.get(key, self.usd.get(UNKNOWN_GPU, DEFAULTS[UNKNOWN_GPU]))

    def cost(self, resource_seconds: Mapping[str, float]) -> float:
        """USD for resource-seconds per type: sum of seconds / 3600 x hourly price."""
        return sum(s / 3600.0 * self.per_hour(k) for k, s in resource_seconds.items())

    def storage_per_month(self, nbytes: int) -> float:
        return nbytes / 1e9 * self.usd.get(STORAGE, DEFAULTS[STORAGE])
