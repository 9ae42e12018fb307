"""`Park`: how a step unwinds after it checkpointed on a pause request.

A module of its own so the data layer can raise and catch it without importing
the step context (and the checkpoint writer, and NumPy) at start-up.
"""

from __future__ import annotations


class Park(BaseException):
    """Unwinds a step after it checkpointed on a pause request.

    A BaseException, so a step's ``except Exception`` cannot swallow it.
    """
