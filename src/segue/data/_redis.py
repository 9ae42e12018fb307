"""The one place segue.data imports redis-py: a client from a URL, or one line naming the extra.

Imported by the Redis stream source and sink only when they connect, so
``import segue.data`` never needs redis installed.
"""

from __future__ import annotations

from typing import Any

EXTRA_HINT = "pip install 'segue[redis]'"


def connect(url: str, what: str) -> Any:
    """A ``redis.Redis`` for ``url`` (``redis://host:port/db``), replies decoded as str."""
    try:
        import redis
    except ImportError:
        raise ImportError(f"{what} needs redis-py, which is not installed: {EXTRA_HINT}") from None
    return redis.Redis.from_url(url, decode_responses=True)
