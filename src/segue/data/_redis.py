"""The one place segue.data imports redis-py: a client from a URL, or one line naming the extra.

Imported by the Redis stream source and sink only when they connect, so
``import segue.data`` never needs redis installed.
"""

from __future__ import annotations

from typing import Any

from ._urls import redact
from .errors import DataError

EXTRA_HINT = "pip install 'segue[redis]'"


def connect(url: str, what: str, timeout_s: float | None = None) -> Any:
    """A ``redis.Redis`` for ``url`` (``redis://host:port/db``), replies decoded as str;
    ``timeout_s`` bounds the connection and each reply (default: none, as redis-py's)."""
    try:
        import redis
    except ImportError:
        raise ImportError(f"{what} needs redis-py, which is not installed: {EXTRA_HINT}") from None
    limits = {} if timeout_s is None else {"socket_connect_timeout": timeout_s,
                                           "socket_timeout": timeout_s}
    return redis.Redis.from_url(url, decode_responses=True, **limits)


def probe(url: str, stream: str, *, must_exist: bool, timeout_s: float = 5.0) -> None:
    """One short connection for ``segue run``: ConnectionError if the server cannot be reached,
    DataError if it refuses the login or (``must_exist``) has no stream ``stream``."""
    client = connect(url, "RedisStreamSource", timeout_s)
    import redis

    try:
        client.ping()
        if must_exist and not client.exists(stream):
            raise DataError(f"stream {stream!r} does not exist at {redact(url)}; check the name, "
                            f"or pass create_stream=True to wait for a producer")
    except redis.AuthenticationError:
        raise DataError(f"the Redis server at {redact(url)} refused the login; check the user "
                        f"and password") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ConnectionError(f"cannot reach the Redis server at {redact(url)} ({exc}); check the "
                              f"host and port") from None
    finally:
        client.close()
