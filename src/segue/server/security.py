"""Request authentication and the cross-origin checks of `segue server`.

A request carries its token as ``Authorization: Bearer TOKEN`` (scripts, the
client) or in the ``segue_token`` cookie (the web UI: HttpOnly,
SameSite=Strict, set by the login form). A token in the URL is refused
outright: URLs end up in logs, histories and Referer headers.

Mutations and event streams also check ``Origin``: a browser page of another
origin cannot drive the API with the user's cookie. A cookie-authenticated
request without an Origin header must say ``Sec-Fetch-Site: same-origin``
(browsers set it and pages cannot), or it is refused too.

Every route is a :class:`GuardedRoute`: it checks the token, the role and the
Origin, then bounds the body (:data:`MAX_BODY_BYTES`, counted as it arrives),
before FastAPI reads or parses a byte of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from ..home import Home
from .auth import LOCAL, Principal, Role, TokenStore

COOKIE = "segue_token"
URL_TOKEN_PARAMS = ("token", "access_token", "auth", "api_key", "apikey", "key", "bearer")
MAX_BODY_BYTES = 1 << 20  # no body the server takes (a submit's params, a pool, a form) comes near it
_GUARD = "segue_guard"  # marks the dependencies Security.require makes
_CHECKED = "segue.principal"  # scope key: (guard, principal) once the route's guard passed


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status_code=401, detail=message, headers={"WWW-Authenticate": "Bearer"})


class Security:
    def __init__(self, home: Home, *, auth: bool = True, allowed_origins: tuple[str, ...] = ()) -> None:
        self.home = home
        self.auth = auth
        self.tokens = TokenStore(home)
        self.allowed_origins = tuple(o.rstrip("/") for o in allowed_origins)

    def authenticate(self, request: Request) -> tuple[Principal, bool]:
        """The request's principal, and whether it came from the cookie."""
        if any(k.lower() in URL_TOKEN_PARAMS for k in request.query_params):
            raise _unauthorized("tokens in the URL are refused (they leak into logs); send "
                                "'Authorization: Bearer TOKEN' instead")
        if not self.auth:
            return LOCAL, False
        header = request.headers.get("authorization")
        from_cookie = False
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _unauthorized("the Authorization header must be 'Bearer TOKEN'")
            token = token.strip()
        else:
            token = request.cookies.get(COOKIE, "")
            from_cookie = True
            if not token:
                raise _unauthorized("a token is required: send 'Authorization: Bearer TOKEN'; an admin "
                                    "creates one with POST /api/tokens (or `segue token create NAME` "
                                    "on the server's host)")
        p = self.tokens.verify(token)
        if p is None:
            raise _unauthorized("the token is not valid (revoked, mistyped, or of another home)")
        return p, from_cookie

    def same_origin(self, request: Request, *, cookie: bool) -> None:
        origin = request.headers.get("origin")
        if origin is None:
            # Browsers omit Origin on same-origin GETs (an EventSource, say) but say
            # where a request comes from in Sec-Fetch-Site, which pages cannot forge.
            if cookie and request.headers.get("sec-fetch-site") != "same-origin":
                raise HTTPException(status_code=403, detail="a browser request with the session cookie "
                                                            "must come from this server's pages; refused")
            return
        own = f"{request.url.scheme}://{request.headers.get('host', '')}".rstrip("/")
        if origin.rstrip("/") != own and origin.rstrip("/") not in self.allowed_origins:
            raise HTTPException(status_code=403, detail=f"requests from origin {origin!r} are refused; "
                                                        f"start the server with --allow-origin to allow it")

    def check(self, request: Request, role: Role, *, mutation: bool = False, stream: bool = False) -> Principal:
        """The request's principal, if it has ``role`` (401/403 otherwise); it reads the tokens file."""
        p, cookie = self.authenticate(request)
        if mutation or stream:
            self.same_origin(request, cookie=cookie)
        if not p.can(role):
            raise HTTPException(status_code=403, detail=f"token {p.name!r} has role "
                                f"{p.role.name.lower()}; this needs {role.name.lower()}")
        return p

    def require(self, role: Role, *, mutation: bool = False, stream: bool = False) -> Callable[..., Any]:
        """A FastAPI dependency: :meth:`check` for ``role``, once per request."""

        async def dependency(request: Request) -> Principal:
            done = request.scope.get(_CHECKED)
            if done is not None and done[0] is dependency:  # GuardedRoute ran it before the body
                return done[1]  # type: ignore[no-any-return]
            p = await run_in_threadpool(self.check, request, role, mutation=mutation, stream=stream)
            request.scope[_CHECKED] = (dependency, p)
            return p

        setattr(dependency, _GUARD, True)
        return dependency


def _too_large() -> HTTPException:
    return HTTPException(status_code=413, detail=f"the request body is over the server's limit of "
                                                 f"{MAX_BODY_BYTES} bytes; send a smaller one")


def _counted(receive: Receive) -> Receive:
    """``receive`` that refuses (413) once the body passes the limit: a chunked body
    declares no length, so only counting what arrives bounds it."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                raise _too_large()
        return message

    return counted


class GuardedRoute(APIRoute):
    """A route that runs its :meth:`Security.require` check, then bounds the body, first.

    FastAPI reads and parses a declared body before it runs any dependency: a caller
    without a token would get a 422 for bad JSON, and make the server hold a huge body,
    before the 401. Here the guard (401/403) runs before a byte is read, a declared
    Content-Length over :data:`MAX_BODY_BYTES` is a 413 at once, and a body without
    one is counted as it arrives. FastAPI still runs the guard as a dependency: it
    returns the principal found here.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        guards = [d.call for d in self.dependant.dependencies
                  if d.call is not None and getattr(d.call, _GUARD, False)]
        inner = self.app

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                request = Request(scope, receive)
                for guard in guards:
                    await guard(request)
                declared = request.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                    raise _too_large()
                receive = _counted(receive)
            await inner(scope, receive, send)

        self.app = guarded
