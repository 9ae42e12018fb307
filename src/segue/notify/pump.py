"""The pump: queue what the hooks want from the event log, then send what is due.

Any process of the home may pump (a controller's notifier thread, the server,
`segue webhook flush`), and several may at once: queueing is idempotent and a
delivery is claimed before it is sent (:mod:`segue.store.outbox`). Each
attempt's end is recorded before the next one: delivered, given up, or
pending again after an exponential backoff (bounded by the hook's
``max_attempts``).

The body of a delivery is fixed when it is queued, so every attempt (and every
pump) sends the same bytes; only the timestamp and its signature change.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .._canon import canonical_json
from ..home import Home
from ..hostname import this_host
from ..store import open_outbox, open_store
from ..store.base import Clock, Store
from ..store.outbox import Delivery, RunEvent, SQLiteOutbox
from ..store.postgres_outbox import PostgresOutbox
from .hooks import Hook, HooksFile, notification_of
from .signing import sign
from .transport import Answer, post

log = logging.getLogger("segue.notify")

LEASE_MARGIN_S = 5.0  # a claim outlives the request's timeout by this much
READ_LIMIT = 1000  # run transitions read per pass
FULL_PASS_S = 5.0  # an idle pump still reads the whole outbox this often (another pump's leftovers)
PRUNE_EVERY_S = 3600.0
KEEP_DELIVERED_S = 7 * 86400.0  # delivered rows are forgotten after this (the events stay)


@dataclass(frozen=True)
class PumpResult:
    queued: int = 0
    delivered: int = 0
    retrying: int = 0
    given_up: int = 0
    next_due: float | None = None  # on the store's clock; None: nothing waits


def _user_agent() -> str:
    from .._version import __version__

    return f"segue/{__version__}"


# The notifications that carry the failed steps' errors (a pause_on_failure run pauses).
WITH_ERRORS = ("failed", "paused")


def body_of(home: Home, hook: Hook, notification: str, e: RunEvent,
            errors: dict[str, str] | None = None) -> str:
    """``errors``: each failed step's error, as `segue status` shows it; "error" is the
    first of them (None when no step failed: an operator's pause, a pool too small)."""
    errors = errors or {}
    return canonical_json({
        "delivery": str(e.id), "event": notification, "hook": hook.id, "home": str(home.root),
        "run_id": e.run_id, "flow": e.flow, "from_state": e.from_state, "to_state": e.to_state,
        "actor": e.actor, "reason": e.reason, "time": e.time,
        "error": next(iter(errors.values()), None), "errors": errors,
    })


def step_errors(store: Store, e: RunEvent) -> dict[str, str]:
    """The error of each step whose last transition before ``e`` was to FAILED, from the
    event log (never rewritten), so every pump builds the same body."""
    last: dict[str, tuple[str | None, str]] = {}
    for t in store.list_events(e.run_id, kinds=("task",)):
        if t.id < e.id and t.step and t.to_state:
            last[t.step] = (t.to_state, str((t.data or {}).get("error") or ""))
    return {step: error for step, (to, error) in last.items() if to == "FAILED" and error}


class Pump:
    """Delivers the notifications of one home. Not thread-safe: one per thread."""

    def __init__(self, home: Home, *, clock: Clock | None = None, owner: str | None = None) -> None:
        self.home = home
        self.hooks = HooksFile(home)
        self._clock = clock  # None: the outbox's (SQLite: this host's; PostgreSQL: the database's)
        self.owner = owner or f"{this_host()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._box: SQLiteOutbox | PostgresOutbox | None = None
        self._store: Store | None = None  # opened for the first failure's errors
        # What the last full pass saw: while nothing changed, a pass is one cheap read.
        self._seen: tuple[int, object] | None = None
        self._full_at = -FULL_PASS_S
        self._pruned_at = -PRUNE_EVERY_S
        self._next_due: float | None = None

    @property
    def outbox(self) -> SQLiteOutbox | PostgresOutbox:
        if self._box is None:
            self._box = open_outbox(self.home.root, clock=self._clock, url=self.home.store)  # the home's backend
        return self._box

    def clock(self) -> float:
        """The clock deliveries are timed by: the outbox's, unless one was given."""
        return self._clock() if self._clock is not None else self.outbox.now()

    def close(self) -> None:
        if self._box is not None:
            self._box.close()
        if self._store is not None:
            self._store.close()

    def _errors(self, name: str, e: RunEvent) -> dict[str, str]:
        if name not in WITH_ERRORS:
            return {}
        if self._store is None:
            self._store = open_store(self.home.root, self.home.store)
        return step_errors(self._store, e)

    def drain(self, seconds: float, *, once: Callable[[float], PumpResult | None] | None = None,
              max_sleep_s: float = 1.0) -> tuple[int, int]:
        """Deliver (and retry) what is due for up to ``seconds``; stop early once nothing
        is due before the deadline. ``once(deadline)`` replaces ``run_once`` (a notifier
        that must not raise passes its guarded one; None from it stops the drain).
        Returns (delivered, given up)."""
        deadline = time.monotonic() + seconds
        delivered = given_up = 0
        while time.monotonic() < deadline:
            until = self.clock() + (deadline - time.monotonic())
            r = once(until) if once is not None else self.run_once(deadline=until)
            if r is None:
                break
            delivered, given_up = delivered + r.delivered, given_up + r.given_up
            wait = None if r.next_due is None else r.next_due - self.clock()
            if wait is None or wait >= deadline - time.monotonic():
                break  # nothing due before the deadline: the next pump's
            time.sleep(min(max(wait, 0.02), max_sleep_s))
        return delivered, given_up

    def run_once(self, *, limit: int = 50, deadline: float | None = None) -> PumpResult:
        """Queue, then send up to ``limit`` due deliveries, none started after ``deadline``
        (store clock). Raises what the store raises; a receiver's failure is an outcome."""
        hooks = self.hooks.load()
        if not hooks or not self.home.exists():
            return PumpResult()
        t = time.monotonic()
        seen = (self.outbox.last_position(), hooks)  # load() returns the same dict while unchanged
        if (self._seen is not None and seen[0] == self._seen[0] and seen[1] is self._seen[1]
                and t - self._full_at < FULL_PASS_S
                and (self._next_due is None or self._next_due > self.clock())):
            return PumpResult(next_due=self._next_due)  # no new transition, nothing due yet
        if t - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = t
            self.outbox.forget_delivered(older_than_s=KEEP_DELIVERED_S)
        queued = self.queue(hooks)
        delivered = retrying = given_up = 0
        for d in self.outbox.due(limit=limit):
            if deadline is not None and self.clock() >= deadline:
                break
            hook = hooks.get(d.hook_id)
            if hook is None:
                continue  # removed from the file; `segue webhook rm` drops its rows
            outcome = self.send(hook, d)
            delivered += outcome == "delivered"
            retrying += outcome == "pending"
            given_up += outcome == "failed"
        self._seen, self._full_at, self._next_due = seen, t, self.outbox.next_due()
        return PumpResult(queued, delivered, retrying, given_up, self._next_due)

    def queue(self, hooks: dict[str, Hook]) -> int:
        """Match new run transitions against every hook; returns how many were queued.
        Cursors and ``upto`` are commit positions (:mod:`segue.store.outbox`)."""
        box = self.outbox
        cursors = box.cursors(hooks)
        start = min(cursors.values())
        upto, events = box.run_events(start, limit=READ_LIMIT)
        queued = 0
        errors: dict[int, dict[str, str]] = {}  # by event: read once for every hook
        for hook in hooks.values():
            items = []
            for e in events:
                name = notification_of(e.to_state, e.actor)
                if e.pos > cursors[hook.id] and name is not None and hook.wants(name, e.run_id):
                    if e.id not in errors:
                        errors[e.id] = self._errors(name, e)
                    items.append((e.id, e.run_id, name, body_of(self.home, hook, name, e, errors[e.id])))
            # Write only when something matched, or to keep the scan short: an idle
            # pump must not take the write lock every time round.
            if items or upto - cursors[hook.id] >= READ_LIMIT:
                queued += box.enqueue(hook.id, items, upto=upto)
        return queued

    def send(self, hook: Hook, d: Delivery) -> str | None:
        """Claim, send and settle one delivery; its new status (None: another pump has it)."""
        box = self.outbox
        got = box.claim(d.event_id, d.hook_id, owner=self.owner,
                        lease_s=hook.timeout_s + LEASE_MARGIN_S)
        if got is None:
            return None
        if got.attempts > hook.max_attempts:  # its last attempt's pump died mid-send
            box.settle(got.event_id, got.hook_id, owner=self.owner, status="failed",
                       error=got.last_error or "gave up: the last attempt was lost")
            return "failed"
        answer = self._post(hook, got)
        if answer.delivered:
            status, next_at = "delivered", None
        elif answer.permanent or got.attempts >= hook.max_attempts:
            status, next_at = "failed", None
        else:
            status, next_at = "pending", self.clock() + hook.backoff(got.attempts)
        if not box.settle(got.event_id, got.hook_id, owner=self.owner, status=status,
                          next_at=next_at, error=answer.error):
            log.info("webhook %s delivery %d: the claim lapsed while sending (another pump "
                     "may send it again; receivers dedupe on X-Segue-Delivery)", hook.id, got.event_id)
            return None
        if status == "failed":
            log.warning("webhook %s: gave up delivering %s of run %s (event %d) after %d attempt(s): %s",
                        hook.id, got.event, got.run_id, got.event_id, got.attempts, answer.error)
        elif status == "pending":
            log.info("webhook %s: %s of run %s not delivered (%s); attempt %d of %d in %.1fs",
                     hook.id, got.event, got.run_id, answer.error, got.attempts, hook.max_attempts,
                     hook.backoff(got.attempts))
        return status

    def _post(self, hook: Hook, d: Delivery) -> Answer:
        body = d.body.encode()
        ts = str(int(time.time()))  # the receiver's clock, not a test's virtual one
        headers = {
            "Content-Type": "application/json", "User-Agent": _user_agent(),
            "X-Segue-Event": d.event, "X-Segue-Delivery": str(d.event_id), "X-Segue-Hook": hook.id,
            "X-Segue-Attempt": str(d.attempts), "X-Segue-Timestamp": ts,
            "X-Segue-Signature": sign(hook.secret, ts, body),
        }
        return post(hook.url, body, headers, timeout_s=hook.timeout_s)
