"""Tokens, roles and who may pause or resume what: the server's access rules.

Tokens live in ``HOME/tokens.json`` (mode 0600, replaced atomically), stored
as SHA-256 digests: the plain token is shown once, when it is created. A token
carries a role and, for operators, the priority classes whose runs it may
pause (and cancel) and resume (and submit):

    role       may
    viewer     read everything the API shows
    operator   + submit, pause, resume, cancel (within its priority classes)
    admin      + configure the pool, on every class

Checks compare digests with ``hmac.compare_digest`` against every stored token,
so the time taken does not tell how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from ..errors import UsageError
from ..home import Home
from ..scheduler.policy import PRIORITY_CLASSES as CLASSES

TOKENS_FILE = "tokens.json"
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

    def create(self, name: str, role: Role, *, may_pause: list[str] | None = None,
               may_resume: list[str] | None = None) -> str:
        """Store a new token and return it in plain text (the only time it is shown)."""
        if not _NAME.fullmatch(name):
            raise UsageError(f"token name {name!r} must be 1-64 letters, digits, or _.@- "
                             f"(starting with a letter or digit)")
        tokens = list(self._load())  # a copy: the loaded list is cached
        if any(t["name"] == name for t in tokens):
            raise UsageError(f"a token named {name!r} exists; revoke it first with "
                             f"`segue token revoke {name}` or pick another name")
        token = PREFIX + secrets.token_urlsafe(32)  # 256 random bits
        tokens.append({"name": name, "role": role.name.lower(), "sha256": _digest(token),
                       "may_pause": may_pause or [ALL], "may_resume": may_resume or [ALL],
                       "created_at": time.time()})
        self._save(tokens)
        return token

    def revoke(self, name: str) -> None:
        tokens = self._load()
        kept = [t for t in tokens if t["name"] != name]
        if len(kept) == len(tokens):
            raise UsageError(f"no token named {name!r}; `segue token list` shows them")
        self._save(kept)

    def list(self) -> list[Principal]:
        return [_principal(t) for t in self._load()]

    def verify(self, token: str) -> Principal | None:
        """The principal of ``token``, or None. Every stored digest is compared."""
        digest = _digest(token)
        found = None
        for t in self._load():
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
