"""The web UI's routes: login, the runs, run and pool pages, and their static files.

Pages are rendered on the server (Jinja2, autoescaping on for everything).
The page script only refreshes a page's live part (``?partial=1``) and sends
the steering buttons to the API (``POST /api/runs/{id}/pause`` ...), where
the API checks the role and the Origin as for any other caller.

A page without a valid token redirects to the login form; the token goes in a
POST body and comes back as the ``segue_token`` cookie (HttpOnly,
SameSite=Strict, Secure over https), never in a URL.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ... import errors
from ...client.local import LocalClient
from ...home import check_run_id
from ...run.logs import check_step
from ..app import status_of
from ..auth import Principal
from ..security import COOKIE, Security
from . import listing, poolview, views
from .envview import environment_view

HERE = Path(__file__).parent
STATIC = {  # the only files served from the package: a fixed list, no path from the request
    "segue.css": "text/css; charset=utf-8",
    "segue.js": "text/javascript; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; form-action 'self'; base-uri 'none'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with a
    # form or fetch POST, and the same-origin check refuses the login and the buttons.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
MAX_FORM_BYTES = 4096


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(when=_when, dur=_dur, size=_size, usd=_usd, num=_num)
    return env


def register(app: FastAPI, client_for: Callable[[Principal], LocalClient], sec: Security) -> None:
    env = environment()

    def render(request: Request, name: str, status: int = 200, p: Principal | None = None,
               **ctx: Any) -> HTMLResponse:
        html = env.get_template(name).render(principal=p, auth=sec.auth, path=request.url.path, **ctx)
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def viewer(request: Request) -> Principal | None:
        """The page's principal; None when it must log in first."""
        try:
            return sec.authenticate(request)[0]
        except HTTPException as exc:
            if exc.status_code == 401:
                return None
            raise

    def to_login(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.query_params.get("partial"):  # the page script reloads into the form
            return Response(status_code=401, headers=HEADERS)
        return RedirectResponse("/login?" + urllib.parse.urlencode({"next": target}), status_code=303,
                                headers=HEADERS)

    def failed(request: Request, p: Principal, exc: errors.SegueError) -> HTMLResponse:
        return render(request, "error.html", status_of(exc), p, title="error", message=str(exc),
                      kind=type(exc).__name__)

    # -- login --------------------------------------------------------------------------

    @app.get("/login", include_in_schema=False, response_model=None)
    def login_form(request: Request, next: str = Query("/", max_length=2048)) -> Response:
        if not sec.auth:
            return RedirectResponse("/", status_code=303, headers=HEADERS)
        return render(request, "login.html", title="log in", next=_safe_next(next), message=None)

    @app.post("/login", include_in_schema=False, response_model=None)
    async def login(request: Request) -> Response:
        sec.same_origin(request, cookie=False)  # another site may not log a browser in
        if not sec.auth:
            return RedirectResponse("/", status_code=303, headers=HEADERS)
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return render(request, "login.html", 413, title="log in", next="/", message="the form is too large")
        form = urllib.parse.parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=4)
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or ["/"])[0])
        p = sec.tokens.verify(token) if token else None
        if p is None:
            return render(request, "login.html", 401, title="log in", next=target,
                          message="that token is not valid (revoked, mistyped, or of another home)")
        resp = RedirectResponse(target, status_code=303, headers=HEADERS)
        resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
        return resp

    @app.post("/logout", include_in_schema=False, response_model=None)
    def logout(request: Request) -> Response:
        sec.same_origin(request, cookie=True)
        resp = RedirectResponse("/login" if sec.auth else "/", status_code=303, headers=HEADERS)
        resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
        return resp

    # -- pages -------------------------------------------------------------------------

    @app.get("/", include_in_schema=False, response_model=None)
    def runs_page(request: Request, state: str = Query("", max_length=16), flow: str = Query("", max_length=256),
                  page: int = Query(1, ge=1, le=1_000_000)) -> Response:
        p = viewer(request)
        if p is None:
            return to_login(request)
        try:
            chosen = listing.parse_state(state)
        except ValueError as exc:
            return failed(request, p, errors.UsageError(str(exc)))
        t0 = time.perf_counter()
        try:
            data = listing.listing(client_for(p), state=chosen, flow=flow or None, page=page)
        except errors.SegueError as exc:
            return failed(request, p, exc)
        return render(request, "runs.html", p=p, title="runs", data=data,
                      elapsed_ms=round((time.perf_counter() - t0) * 1000), page_url=_page_url)

    @app.get("/runs/{run_id}", include_in_schema=False, response_model=None)
    def run_page(request: Request, run_id: str, step: str | None = Query(None, max_length=64),
                 attempt: int | None = Query(None, ge=1), events: str = Query("important", max_length=16),
                 expand: list[str] = Query([]), partial: bool = False) -> Response:
        p = viewer(request)
        if p is None:
            return to_login(request)
        try:
            check_run_id(run_id)
            if step is not None:
                check_step(step)  # 400 before anything is read: step names become file names
            data = views.run_page(client_for(p), p, run_id, step=step, attempt=attempt, events_filter=events,
                                  expand=[g for g in expand[:64] if len(g) <= 80])
            _check_selected(data, run_id, step, attempt)
        except errors.SegueError as exc:
            return failed(request, p, exc)
        name = "run_live.html" if partial else "run.html"
        env = None if partial else environment_view(client_for(p), run_id)  # once per page, not per poll
        return render(request, name, p=p, title=f"run {run_id}", d=data, query=_query(request), env=env)

    @app.get("/pool", include_in_schema=False, response_model=None)
    def pool_page(request: Request, partial: bool = False) -> Response:
        p = viewer(request)
        if p is None:
            return to_login(request)
        try:
            data = poolview.pool_page(client_for(p))
        except errors.SegueError as exc:
            return failed(request, p, exc)
        return render(request, "pool_live.html" if partial else "pool.html", p=p, title="pool", d=data)

    @app.get("/favicon.ico", include_in_schema=False, response_model=None)
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/{name}", include_in_schema=False, response_model=None)
    def static(name: str) -> Response:
        if name not in STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


def _check_selected(d: views.RunPage, run_id: str, step: str | None, attempt: int | None) -> None:
    """A step or attempt the run lacks is a 404 (as in the API), not the page of another one."""
    names = [s.name for s in d.status.steps]
    if step is not None and step not in names and d.selected.step != step:  # NAME.K: a fan-out's task
        raise errors.NotFoundError(f"run {run_id!r} has no step {step!r}; its steps: {', '.join(names)}")
    if attempt is not None and d.selected.attempt != attempt:
        tried = [str(a.attempt) for a in d.selected.attempts]
        have = f"attempts {', '.join(tried)}" if tried else "no attempts yet"
        raise errors.NotFoundError(f"step {d.selected.step!r} of run {run_id!r} has {have}; "
                                   f"there is no attempt {attempt}")


def _safe_next(target: str) -> str:
    """Only a path of this server: never another host (an open redirect after login)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target or any(
            ord(c) < 32 for c in target):
        return "/"
    return target


def _query(request: Request) -> Callable[..., str]:
    """``query(step="x")``: this page's URL with some parameters replaced (None drops one)."""
    base = [(k, v) for k, v in request.query_params.multi_items() if k != "partial"]

    def build(**changes: Any) -> str:
        keep = [(k, v) for k, v in base if k not in changes]
        for k, v in changes.items():
            if isinstance(v, list | tuple):
                keep += [(k, str(x)) for x in v]
            elif v is not None:
                keep.append((k, str(v)))
        qs = urllib.parse.urlencode(keep)
        return request.url.path + (f"?{qs}" if qs else "")

    return build


def _page_url(data: listing.Listing, page: int) -> str:
    q = {k: v for k, v in (("state", data.state), ("flow", data.flow)) if v}
    q["page"] = str(page)
    return "/?" + urllib.parse.urlencode(q)


# -- filters ------------------------------------------------------------------------------


def _when(t: float | None) -> str:
    if not t:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h:02d}h"


def _size(n: float | None) -> str:
    if n is None:
        return "—"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def _usd(x: float | None) -> str:
    if x is None:
        return "—"
    return f"${x:,.2f}" if x >= 1 else f"${x:.4f}"


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.2f}" if abs(x) < 1000 else f"{x:,.0f}"
