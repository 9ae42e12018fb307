"""The server pumps the home's webhooks too, while it runs (see :mod:`segue.notify`).

Controllers pump while they drive a run; the server covers the time between
them (a delivery still retrying after its controller ended, one left behind
by a killed controller, a transition made by the CLI with no controller).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from ..client.local import LocalClient
from ..notify.notifier import Notifier, start_notifier
from .app import _EXTENSIONS
from .auth import Principal
from .security import Security

SHUTDOWN_DRAIN_S = 1.0


def register(app: FastAPI, client_for: Callable[[Principal], LocalClient], sec: Security) -> None:
    running: list[Notifier] = []

    def start() -> None:
        n = start_notifier(app.state.home)
        if n is not None:
            running.append(n)

    def stop() -> None:
        while running:
            running.pop().stop(SHUTDOWN_DRAIN_S)

    app.router.on_startup.append(start)
    app.router.on_shutdown.append(stop)


if register not in _EXTENSIONS:
    _EXTENSIONS.append(register)
