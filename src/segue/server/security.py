"""Request authentication and the cross-origin checks of `segue server`.

A request carries its token as ``Authorization: Bearer TOKEN`` (scripts, the
client) or in the ``segue_token`` cookie (the web UI: HttpOnly,
SameSite=Strict, set by the login form). A token in the URL is refused
outright: URLs end up in logs, histories and Referer headers.

Mutations and event streams also check ``Origin``: a browser page of another
origin cannot drive the API with the user's cookie. A cookie-authenticated
request without an Origin header must say ``Sec-Fetch-Site: same-origin``
(browsers set it and pages cannot), or it is refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request

from ..home import Home
from .auth import LOCAL, Principal, Role, TokenStore

COOKIE = "segue_token"
URL_TOKEN_PARAMS = ("token", "access_token", "auth", "api_key", "apikey", "key", "bearer")


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
                raise _unauthorized("a token is required: send 'Authorization: Bearer TOKEN' "
                                    "(create one with `segue token create NAME --role viewer`)")
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

    def require(self, role: Role, *, mutation: bool = False, stream: bool = False) -> Callable[..., Any]:
        """A FastAPI dependency: the principal, if it has ``role`` (401/403 otherwise)."""

        def dependency(request: Request) -> Principal:
            p, cookie = self.authenticate(request)
            if mutation or stream:
                self.same_origin(request, cookie=cookie)
            if not p.can(role):
                raise HTTPException(status_code=403, detail=f"token {p.name!r} has role "
                                    f"{p.role.name.lower()}; this needs {role.name.lower()}")
            return p

        return dependency
