"""The server fires the home's schedules too, while it runs (see :mod:`segue.run.schedules`).

`segue agent` fires them on each host; a home served by `segue server` alone has
them fired here, by a thread that ticks every second. Both may run at once, on one
host or many: each slot is fired once, fenced in the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fastapi import FastAPI

from ..client.local import LocalClient
from ..hostname import this_host
from ..run.schedules import ScheduleFirer
from .app import _EXTENSIONS
from .auth import LOCAL, Principal
from .security import Security

log = logging.getLogger("segue.server.schedules")

TICK_S = 1.0
SHUTDOWN_WAIT_S = 2.0


def register(app: FastAPI, client_for: Callable[[Principal], LocalClient], sec: Security) -> None:
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def loop() -> None:
        home = app.state.home
        firer: ScheduleFirer | None = None
        while not stop.is_set():
            try:
                if home.exists():  # a home is never created by serving it
                    if firer is None:
                        client = client_for(LOCAL)
                        firer = ScheduleFirer(home, client.store, pool=str(client.pool_path),
                                              actor=f"server:{this_host()}")
                    firer.tick()
            except Exception as exc:  # noqa: BLE001 - the server serves on; the next tick tries again
                log.warning("schedules: %s", exc)
            stop.wait(TICK_S)

    def start() -> None:
        t = threading.Thread(target=loop, name="segue-schedules", daemon=True)
        threads.append(t)
        t.start()

    def shutdown() -> None:
        stop.set()
        for t in threads:
            t.join(SHUTDOWN_WAIT_S)

    app.router.on_startup.append(start)
    app.router.on_shutdown.append(shutdown)


if register not in _EXTENSIONS:
    _EXTENSIONS.append(register)
