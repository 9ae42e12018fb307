"""What segue's own processes see: the settings in their environment and their store.

Each step returns the ``SEGUE_*`` names in its process's environment (fault
injection aside), the host name it goes by and whether its home was given a store
explicitly. ``ranks`` is a two-rank gang: the rank processes open the store
themselves, so it only finishes if they were told the same store.
"""

import os

from segue import Flow

flow = Flow("envsee")


def seen(ctx) -> dict:
    from segue.hostname import this_host

    return {"env": sorted(k for k in os.environ if k.startswith("SEGUE_") and not k.startswith("SEGUE_FAULTS")),
            "host": this_host(), "explicit_store": ctx.home is not None and ctx.home.store is not None}


@flow.step()
def plain(ctx):
    return seen(ctx)


@flow.step(world_size=2, after=["plain"])
def ranks(ctx):
    return seen(ctx) if ctx.rank == 0 else None
