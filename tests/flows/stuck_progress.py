"""A step that reports 0 of 10 done and never more, for `segue verify` tests.

Faults planned at 5-90% of the work never come due, so none can land: the
verify must say so. With ``hang=True`` the faulted run (its working directory
is the verify sandbox's ``faulted``) never ends, so a test can stop the
verify while its detached controller runs.
"""

import os
import time

from segue import Flow

flow = Flow("stuck", params={"sleep": 3.0, "hang": False})


@flow.step
def work(ctx):
    ctx.progress(0, 10)
    forever = ctx.params["hang"] and os.path.basename(os.getcwd()) == "faulted"
    end = time.monotonic() + ctx.params["sleep"]
    while forever or time.monotonic() < end:
        time.sleep(0.05)
    return {"ok": True}
