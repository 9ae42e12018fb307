"""A background thread that pumps a home's webhooks, for controllers and the server.

It has its own store connection and catches everything: a receiver that hangs,
a malformed webhooks.json or a locked database is logged (once per distinct
problem) and never reaches the thread that started it. ``stop`` drains for a
bounded time, so the notification of the transition a controller ended on
(SUCCEEDED, PAUSED...) usually leaves with it; whatever is still due then
stays in the outbox for the next pump (another controller of the home, the
server, `segue webhook flush`).
"""

from __future__ import annotations

import logging
import threading

from ..home import Home
from .pump import Pump, PumpResult

log = logging.getLogger("segue.notify")

INTERVAL_S = 0.5  # how often an idle pump looks for new transitions
DRAIN_S = 5.0  # how long stop() keeps delivering (and retrying) what is due


class Notifier:
    def __init__(self, home: Home, *, interval_s: float = INTERVAL_S, name: str = "segue-webhooks") -> None:
        self.home = home
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._drain_s = 0.0
        self._last_problem = ""
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> Notifier:
        self._thread.start()
        return self

    def stop(self, drain_s: float = DRAIN_S) -> None:
        """Deliver what is due for up to ``drain_s`` more seconds, then stop. Never raises."""
        try:
            self._drain_s = max(0.0, drain_s)
            self._stop.set()
            if self._thread.is_alive():
                # A request in flight at the deadline is not waited for: the thread is a
                # daemon, and its claim's lease lets the next pump send it again.
                self._thread.join(self._drain_s + 1.0)
        except Exception as exc:  # never into the caller (a controller on its way out)
            log.warning("webhook notifier of %s did not stop cleanly: %s", self.home.root, exc)

    # -- the thread -------------------------------------------------------------
    def _main(self) -> None:
        pump = Pump(self.home)
        try:
            while not self._stop.is_set():
                self._once(pump)
                self._stop.wait(self.interval_s)
            self._drain(pump)
        except BaseException as exc:  # noqa: BLE001 - the thread must end quietly
            log.warning("webhook notifier of %s stopped: %s", self.home.root, exc)
        finally:
            try:
                pump.close()
            except Exception:  # noqa: S110 - closing a connection that failed to open
                pass

    def _drain(self, pump: Pump) -> None:
        pump.drain(self._drain_s, once=lambda until: self._once(pump, deadline=until), max_sleep_s=0.5)

    def _once(self, pump: Pump, deadline: float | None = None) -> PumpResult | None:
        try:
            r = pump.run_once(deadline=deadline)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._last_problem:  # once per distinct problem, not every 0.5 s
                log.warning("webhooks of %s: %s; deliveries wait until it is fixed",
                            self.home.root, problem)
                self._last_problem = problem
            return None
        self._last_problem = ""
        return r


def start_notifier(home: Home, *, interval_s: float = INTERVAL_S) -> Notifier | None:
    """Start a notifier for ``home``; None (logged) if even that failed. Never raises."""
    try:
        return Notifier(home, interval_s=interval_s).start()
    except Exception as exc:
        log.warning("webhook notifier of %s not started: %s", home.root, exc)
        return None
