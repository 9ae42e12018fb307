"""How a webhook request is signed, and how a receiver checks it.

    X-Segue-Timestamp: 1764500000                    (unix seconds when it was sent)
    X-Segue-Signature: sha256=HEX                    HMAC-SHA256(secret, TIMESTAMP + "." + BODY)

The timestamp is inside the signed bytes, so a captured request cannot be
replayed later with a fresh timestamp: a receiver refuses a timestamp older
than its tolerance (:func:`verify`, five minutes by default) and dedupes the
rest on ``X-Segue-Delivery``. Compare with ``hmac.compare_digest``, never ``==``.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SCHEME = "sha256"
TOLERANCE_S = 300.0


def signed_bytes(timestamp: str, body: bytes) -> bytes:
    return timestamp.encode("ascii") + b"." + body


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The value of ``X-Segue-Signature``."""
    mac = hmac.new(secret.encode(), signed_bytes(timestamp, body), hashlib.sha256).hexdigest()
    return f"{SCHEME}={mac}"


def verify(secret: str, timestamp: str, body: bytes, signature: str, *,
           tolerance_s: float = TOLERANCE_S, now: float | None = None) -> bool:
    """A receiver's check: the signature matches and the timestamp is recent."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    t = time.time() if now is None else now
    if abs(t - sent) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature.strip())
