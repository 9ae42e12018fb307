"""A flow that prints, fails once with a traceback, and can wait on a gate file.

``talk`` prints a line naming its attempt and fails its first attempt deep in
a helper (so the traceback has several lines); ``gate`` prints, then waits
until the file ``gate`` names exists (so a test can watch `segue logs
--follow` before the run ends); ``bad`` always fails unless ``bad`` is false.
"""

import os
import time

from segue import Flow

flow = Flow("chatty", params={"gate": "", "bad": True})


def _deep(attempt):
    if attempt == 1:
        raise ValueError(f"boom at attempt {attempt}")


@flow.step(retries=2)
def talk(ctx):
    print(f"hello from attempt {ctx.attempt}", flush=True)
    _deep(ctx.attempt)
    return {"attempt": ctx.attempt}


@flow.step(after=[talk])
def gate(ctx):
    print("waiting for the gate", flush=True)
    while ctx.params["gate"] and not os.path.exists(ctx.params["gate"]):
        time.sleep(0.02)
    print("through the gate", flush=True)
    return None


@flow.step(after=[gate], retries=0)
def bad(ctx):
    print("about to break", flush=True)
    if ctx.params["bad"]:
        raise RuntimeError("always broken")
    return [1, 2, 3]
