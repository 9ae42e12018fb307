"""Canonical JSON and content hashes: the basis of every deterministic identity."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Serialize with sorted keys and no whitespace, so equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def digest(value: Any) -> str:
    """A stable hex digest of a JSON-able value (sha256 of its canonical JSON)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
