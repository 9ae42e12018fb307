"""Webhook notifications of run transitions (failed, paused, preempted, succeeded...).

Hooks are configured per home (:mod:`.hooks`, ``HOME/webhooks.json``, managed by
`segue webhook`). Deliveries go through a durable outbox in the home's store
(:mod:`segue.store.outbox`), filled from the event log and emptied by a
:class:`~.pump.Pump`, which every controller runs in a background thread
(:mod:`.notifier`), as does `segue server`; so notifications leave without a
server, survive a killed controller, and arrive at least once, signed
(:mod:`.signing`), with the event id as a stable delivery id.

Layering: ``notify`` sits on ``store`` and under ``run``; it never changes a run.
"""

from __future__ import annotations

from .hooks import DEFAULT_EVENTS, EVENTS, Hook, HooksFile
from .notifier import Notifier, start_notifier
from .pump import Pump, PumpResult
from .signing import sign, verify

__all__ = [
    "DEFAULT_EVENTS",
    "EVENTS",
    "Hook",
    "HooksFile",
    "Notifier",
    "Pump",
    "PumpResult",
    "sign",
    "start_notifier",
    "verify",
]
