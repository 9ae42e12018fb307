"""The webhooks of a home: ``HOME/webhooks.json`` (mode 0600: it holds the signing secrets).

    {"version": 1, "hooks": [{"id": "h3f9a01c2", "url": "https://...", "events": ["failed"],
      "secret": "...", "runs": [], "max_attempts": 8, "backoff_s": 2.0, "timeout_s": 10.0,
      "created_at": 1764500000.0}]}

A hook names the notifications it wants (:data:`EVENTS`) and, optionally, the
runs it is about (none: every run of the home). The file is replaced
atomically under a lock, so two `segue webhook add` never lose one another's
hook. Reading never creates anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._atomic import write_atomic
from ..errors import UsageError
from ..home import Home, check_run_id
from ..states import Actor, RunState

HOOKS_FILE = "webhooks.json"
VERSION = 1

# notification -> the run transition it stands for. "preempted" is the scheduler
# moving a RUNNING run to PAUSING for a higher-priority run; it reaches PAUSED later.
EVENTS: dict[str, str] = {
    "failed": "the run is FAILED (a step exhausted its retries, or cannot fit the pool)",
    "paused": "the run is PAUSED (by an operator, a preemption, a full disk or pause_on_failure)",
    "preempted": "the scheduler started pausing the run for a higher-priority one",
    "succeeded": "the run is SUCCEEDED",
    "cancelled": "the run is CANCELLED",
    "running": "the run started, or resumed",
}
DEFAULT_EVENTS = ("failed", "paused", "preempted", "succeeded")

_BY_STATE = {RunState.FAILED: "failed", RunState.PAUSED: "paused", RunState.SUCCEEDED: "succeeded",
             RunState.CANCELLED: "cancelled", RunState.RUNNING: "running"}

MAX_ATTEMPTS = 8  # then the delivery is given up (status failed, `segue webhook ls` counts it)
BACKOFF_S = 2.0  # first retry after this, doubling: 2, 4, 8 ... capped at BACKOFF_CAP_S
BACKOFF_CAP_S = 600.0
TIMEOUT_S = 10.0  # connect and each read, per request


def notification_of(to_state: str | None, actor: str) -> str | None:
    """The notification a run transition is, if any."""
    if to_state == RunState.PAUSING and actor == Actor.SCHEDULER:
        return "preempted"
    try:
        return _BY_STATE.get(RunState(to_state or ""))
    except ValueError:
        return None


def parse_events(text: str) -> list[str]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names:
        raise UsageError(f"give at least one event: {', '.join(EVENTS)}")
    bad = [n for n in names if n not in EVENTS]
    if bad:
        raise UsageError(f"unknown event {bad[0]!r}; one of {', '.join(EVENTS)}")
    return sorted(set(names), key=list(EVENTS).index)


def check_url(url: str) -> str:
    """An http(s) URL with a host and no credentials in it, or UsageError."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a bad port
    except ValueError as exc:
        raise UsageError(f"webhook URL {url!r} is not valid ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"webhook URL {url!r} must be http:// or https://; "
                         f"{parts.scheme + ':' if parts.scheme else 'a relative URL'} is refused")
    if not parts.hostname:
        raise UsageError(f"webhook URL {url!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"webhook URL {url!r} carries credentials; they would be stored and logged "
                         f"with it: authenticate the receiver by the signature instead")
    if port == 0:
        raise UsageError(f"webhook URL {url!r} has port 0")
    if any(c.isspace() for c in url):
        raise UsageError(f"webhook URL {url!r} contains whitespace")
    return url


@dataclass(frozen=True)
class Hook:
    id: str
    url: str
    events: list[str]
    secret: str = field(repr=False)
    runs: list[str] = field(default_factory=list)  # empty: every run of the home
    max_attempts: int = MAX_ATTEMPTS
    backoff_s: float = BACKOFF_S
    timeout_s: float = TIMEOUT_S
    created_at: float = 0.0

    def wants(self, event: str, run_id: str) -> bool:
        return event in self.events and (not self.runs or run_id in self.runs)

    def backoff(self, attempts: int) -> float:
        """Seconds before the next try, after ``attempts`` failed ones (1, 2, ...)."""
        return float(min(BACKOFF_CAP_S, self.backoff_s * 2 ** max(0, attempts - 1)))

    def to_json(self, *, secret: bool = True) -> dict[str, Any]:
        doc = asdict(self)
        if not secret:
            doc.pop("secret")
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Hook:
        try:
            return cls(id=str(d["id"]), url=str(d["url"]), events=[str(e) for e in d["events"]],
                       secret=str(d["secret"]), runs=[str(r) for r in d.get("runs", [])],
                       max_attempts=int(d.get("max_attempts", MAX_ATTEMPTS)),
                       backoff_s=float(d.get("backoff_s", BACKOFF_S)),
                       timeout_s=float(d.get("timeout_s", TIMEOUT_S)),
                       created_at=float(d.get("created_at", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"a webhook in {HOOKS_FILE} is malformed ({type(exc).__name__}: {exc}); "
                             f"remove it with `segue webhook rm ID` or fix the file") from None


class HooksFile:
    """Reads and edits ``HOME/webhooks.json``."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.path = home.root / HOOKS_FILE
        self._cache: tuple[tuple[int, int], dict[str, Hook]] | None = None

    def load(self) -> dict[str, Hook]:
        """The hooks by id; empty without a file. Cached while the file is unchanged,
        so a pump may call this every time round."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._cache = None
            return {}
        key = (st.st_mtime_ns, st.st_size)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        hooks = {h.id: h for h in self._read()}
        self._cache = (key, hooks)
        return hooks

    def _read(self) -> list[Hook]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {self.path} ({exc}); fix or remove it") from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise UsageError(f"{self.path} is not a version {VERSION} webhooks file; fix or remove it")
        return [Hook.from_json(h) for h in doc.get("hooks", [])]

    @contextmanager
    def _locked(self) -> Iterator[list[Hook]]:
        self.home.ensure()
        fd = os.open(self.home.root / f".{HOOKS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self._read()
        finally:
            os.close(fd)  # releases the lock

    def _save(self, hooks: list[Hook]) -> None:
        doc = {"version": VERSION, "hooks": [h.to_json() for h in hooks]}
        write_atomic(self.path, json.dumps(doc, indent=1).encode(), mode=0o600)  # it holds secrets
        self._cache = None

    def add(self, url: str, events: list[str], *, secret: str | None = None,
            runs: list[str] | None = None, max_attempts: int = MAX_ATTEMPTS,
            backoff_s: float = BACKOFF_S, timeout_s: float = TIMEOUT_S) -> Hook:
        """Store a new hook (its secret generated unless given); returns it."""
        check_url(url)
        for e in events:
            if e not in EVENTS:
                raise UsageError(f"unknown event {e!r}; one of {', '.join(EVENTS)}")
        if not events:
            raise UsageError(f"give at least one event: {', '.join(EVENTS)}")
        if secret is not None and len(secret) < 16:
            raise UsageError("the webhook secret must be at least 16 characters")
        if not 1 <= max_attempts <= 100:
            raise UsageError(f"max attempts must be 1-100, not {max_attempts}")
        if not 0 < backoff_s <= BACKOFF_CAP_S:
            raise UsageError(f"backoff must be > 0 and <= {BACKOFF_CAP_S:g} seconds")
        if not 0 < timeout_s <= 120:
            raise UsageError("timeout must be > 0 and <= 120 seconds")
        with self._locked() as hooks:
            taken = {h.id for h in hooks}
            hook_id = next(i for i in (f"h{secrets.token_hex(4)}" for _ in range(100)) if i not in taken)
            hook = Hook(id=hook_id, url=url, events=list(events),
                        secret=secret or secrets.token_urlsafe(32),
                        runs=[check_run_id(r) for r in runs or []], max_attempts=max_attempts,
                        backoff_s=backoff_s, timeout_s=timeout_s, created_at=time.time())
            self._save([*hooks, hook])
        return hook

    def remove(self, hook_id: str) -> Hook:
        with self._locked() as hooks:
            gone = [h for h in hooks if h.id == hook_id]
            if not gone:
                raise UsageError(f"no webhook {hook_id!r}; `segue webhook ls` shows them")
            self._save([h for h in hooks if h.id != hook_id])
        return gone[0]


def read_secret_file(path: str | Path) -> str:
    """A secret from a file (one line; surrounding whitespace dropped)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read the secret file {path} ({exc.strerror or exc})") from None
    secret = text.strip()
    if "\n" in secret:
        raise UsageError(f"the secret file {path} must hold one line")
    return secret

