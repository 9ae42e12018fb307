"""Tokens, roles and who may pause or resume what: the server's access rules.

Tokens live in ``HOME/tokens.json`` (mode 0600, replaced atomically), stored
as SHA-256 digests: the plain token is shown once, when it is created. A token
carries a role and, for operators, the priority classes whose runs it may
pause (and cancel) and resume (and submit):

    role       may
    viewer     read everything the API shows
    operator   + submit, pause, resume, cancel (within its priority classes)
    admin      + configure the pool, create and revoke tokens, on every class

A revoked token stays in the file, marked with who revoked it and when, beside
who created it: the file is also the record of who changed access. Creates
and revokes hold an exclusive lock on ``tokens.lock`` (the CLI and a server
may change tokens at once).

Checks compare digests with ``hmac.compare_digest`` against every stored token,
so the time taken does not tell how much of a guess was right.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from ..errors import NotFoundError, UsageError
from ..home import Home
from ..placement.policy import PRIORITY_CLASSES as CLASSES

TOKENS_FILE = "tokens.json"
LOCK_FILE = "tokens.lock"
PREFIX = "sgt_"  # recognisable in a leaked log or a secret scanner
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
ALL = "*"


class Role(IntEnum):
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise UsageError(f"unknown role {text!r}; one of viewer, operator, admin") from None


def parse_classes(text: str | None) -> list[str]:
    """``"batch,normal"`` -> ["batch", "normal"]; None or ``"*"`` -> every class."""
    if text is None or text.strip() == ALL:
        return [ALL]
    out = []
    for part in text.split(","):
        name = part.strip().lower()
        if name not in CLASSES:
            raise UsageError(f"unknown priority class {part.strip()!r}; one of {', '.join(CLASSES)} or *")
        out.append(name)
    if not out:
        raise UsageError("give at least one priority class, or * for all")
    return sorted(set(out), key=list(CLASSES).index)


@dataclass(frozen=True)
class Principal:
    """Who a request acts as; events name it as ``api:NAME``."""

    name: str
    role: Role
    may_pause: list[str] = field(default_factory=lambda: [ALL])
    may_resume: list[str] = field(default_factory=lambda: [ALL])

    @property
    def actor(self) -> str:
        return f"api:{self.name}"

    def can(self, role: Role) -> bool:
        return self.role >= role

    def may(self, action: str, priority_class: str) -> bool:
        """``action``: "pause" (pause, cancel) or "resume" (resume, submit)."""
        if self.role >= Role.ADMIN:
            return True
        if self.role < Role.OPERATOR:
            return False
        allowed = self.may_pause if action == "pause" else self.may_resume
        return ALL in allowed or priority_class in allowed

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role.name.lower(), "may_pause": self.may_pause,
                "may_resume": self.may_resume}


LOCAL = Principal("local", Role.ADMIN)  # the server started with --no-auth, on loopback only


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """The tokens of one home."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.path = home.root / TOKENS_FILE
        self._cache: tuple[tuple[int, int, int], list[dict[str, Any]]] | None = None

    def _load(self) -> list[dict[str, Any]]:
        """The stored tokens. Every request checks one, so the parsed file is kept while
        its stat is unchanged; a create or a revoke replaces the file, which changes it."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._unreadable(exc) from None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise self._unreadable(exc) from None
        tokens = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(tokens, list):
            raise self._unreadable("no list of tokens in it")
        self._cache = (key, tokens)
        return tokens

    def _unreadable(self, why: object) -> UsageError:
        return UsageError(f"cannot read the tokens file {self.path} ({why}); "
                          f"fix or remove it, then create tokens with `segue token create`")

    def _save(self, tokens: list[dict[str, Any]]) -> None:
        from .._atomic import write_atomic

        self.home.ensure()
        write_atomic(self.path, json.dumps({"version": 1, "tokens": tokens}, indent=1).encode(), mode=0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the tokens' lock: a read-modify-write of the file by one process at a time."""
        self.home.ensure()
        fd = os.open(self.home.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _active(self) -> list[dict[str, Any]]:
        return [t for t in self._load() if not t.get("revoked_at")]

    def create(self, name: str, role: Role, *, may_pause: list[str] | None = None,
               may_resume: list[str] | None = None, actor: str | None = None) -> str:
        """Store a new token and return it in plain text (the only time it is shown);
        ``actor``: who created it (recorded)."""
        if not _NAME.fullmatch(name):
            raise UsageError(f"token name {name!r} must be 1-64 letters, digits, or _.@- "
                             f"(starting with a letter or digit)")
        with self._locked():
            tokens = list(self._load())  # a copy: the loaded list is cached
            if any(t["name"] == name and not t.get("revoked_at") for t in tokens):
                raise UsageError(f"a token named {name!r} exists; revoke it first with "
                                 f"`segue token revoke {name}` or pick another name")
            token = PREFIX + secrets.token_urlsafe(32)  # 256 random bits
            tokens.append({"name": name, "role": role.name.lower(), "sha256": _digest(token),
                           "may_pause": may_pause or [ALL], "may_resume": may_resume or [ALL],
                           "created_at": time.time(), "created_by": actor})
            self._save(tokens)
        return token

    def revoke(self, name: str, *, actor: str | None = None, keep_an_admin: bool = False) -> None:
        """Revoke the token ``name`` (kept in the file as revoked, naming ``actor``).
        ``keep_an_admin``: refuse to revoke the last admin token (the API's rule: an
        admin cannot lock every admin out of the server)."""
        with self._locked():
            tokens = [dict(t) for t in self._load()]
            mine = [t for t in tokens if t["name"] == name and not t.get("revoked_at")]
            if not mine:
                raise NotFoundError(f"no token named {name!r}; `segue token list` shows them")
            admins = [t for t in tokens if t["role"] == "admin" and not t.get("revoked_at")]
            if keep_an_admin and mine[0]["role"] == "admin" and len(admins) == 1:
                raise UsageError(f"token {name!r} is the last admin token; create another admin "
                                 f"token first, or revoke it with `segue token revoke {name}` on the host")
            for t in mine:
                t["revoked_at"], t["revoked_by"] = time.time(), actor
            self._save(tokens)

    def records(self, *, revoked: bool = False) -> list[dict[str, Any]]:
        """What the tokens file says of each token, never the digest: its principal, who
        created it and when, and (``revoked``: those too) who revoked it and when."""
        return [{**_principal(t).to_json(), **{k: t.get(k) for k in ("created_at", "created_by",
                                                                     "revoked_at", "revoked_by")}}
                for t in self._load() if revoked or not t.get("revoked_at")]

    def list(self) -> list[Principal]:
        return [_principal(t) for t in self._active()]

    def verify(self, token: str) -> Principal | None:
        """The principal of ``token``, or None. Every stored digest is compared."""
        digest = _digest(token)
        found = None
        for t in self._active():
            if hmac.compare_digest(digest, str(t.get("sha256", ""))):
                found = t
        return None if found is None else _principal(found)

    def bootstrap(self) -> str | None:
        """At a server's first start, create the ``admin`` token; returns it, or None if
        tokens exist already."""
        if self._load():
            return None
        return self.create("admin", Role.ADMIN)


def _principal(t: dict[str, Any]) -> Principal:
    return Principal(name=t["name"], role=Role.parse(t["role"]), may_pause=list(t.get("may_pause", [ALL])),
                     may_resume=list(t.get("may_resume", [ALL])))
