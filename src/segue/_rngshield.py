"""Keep libraries from drawing on the process-global ``random`` the steps use.

A worker's background threads (heartbeats, the checkpoint writer, the store's
connection pool) run library code at moments no two runs share. A library
that draws jitter from Python's global ``random`` would move the step's own
random stream at such a moment, and a resumed (or merely reconnected) step
would no longer be bit-identical. psycopg_pool draws jitter for every new
connection; botocore for every retry. Each gets a private generator instead.
"""

from __future__ import annotations

import random
import sys

_PRIVATE = random.Random()


def shield_libraries() -> list[str]:
    """Point the jitter of the known libraries that are imported at a private
    generator; returns what it shielded. Idempotent; cheap to call again after
    a lazy import."""
    done: list[str] = []
    pool_base = sys.modules.get("psycopg_pool.base")
    if pool_base is not None and getattr(pool_base, "random", None) is not _PRIVATE.random:
        pool_base.random = _PRIVATE.random  # type: ignore[attr-defined]
        done.append("psycopg_pool")
    if "botocore" in sys.modules:
        import botocore.retries.standard as standard
        import botocore.retryhandler as legacy

        if legacy.random is not _PRIVATE:  # type: ignore[attr-defined]
            legacy.random = _PRIVATE  # type: ignore[attr-defined]  # it calls random.random()
            done.append("botocore.retryhandler")
        init = standard.ExponentialBackoff.__init__
        if init.__defaults__ and random.random in init.__defaults__:
            init.__defaults__ = tuple(_PRIVATE.random if d == random.random else d for d in init.__defaults__)
            done.append("botocore.retries")
    return done
