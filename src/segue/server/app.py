"""The HTTP API of `segue server`: the client contract over REST, one route per method.

    GET  /api/runs                          Client.runs       (viewer)
    POST /api/runs                          Client.submit     (operator, may resume the class)
    GET  /api/runs/{run}                    Client.status     (viewer)
    POST /api/runs/{run}/pause              Client.pause      (operator, may pause the class)
    POST /api/runs/{run}/resume             Client.resume     (operator, may resume the class)
    POST /api/runs/{run}/cancel             Client.cancel     (operator, may pause the class)
    POST /api/runs/{run}/checkpoint         Client.checkpoint_now (operator, may pause the class)
    GET  /api/runs/{run}/events             Client.events     (viewer; ?follow=true: SSE)
    GET  /api/runs/{run}/progress           SSE: the status at each change, until the run rests
    GET  /api/runs/{run}/checkpoints        Client.checkpoints
    GET  /api/runs/{run}/environment        Client.environment (the recorded environment, the diff to now)
    GET  /api/runs/{run}/metrics            Client.metrics    (viewer; ?step=S&since=T)
    GET  /api/runs/{run}/steps/{step}/output  Client.output
    GET  /api/runs/{run}/logs               Client.logs       (?follow=true: SSE)
    GET  /api/pool, /api/queue              Client.pool, Client.queue
    PUT  /api/pool                          configure the pool (admin; recorded with the principal)
    GET  /api/pool/changes                  Client.pool_changes (viewer)
    GET  /api/tokens                        the tokens' principals, never a token (admin;
                                            ?revoked=true: revoked ones too, with who)
    POST /api/tokens                        create a token; the answer is the only copy (admin)
    DELETE /api/tokens/{name}               revoke a token, not the last admin one (admin)
    GET  /api/whoami                        the caller's principal

Errors are JSON ``{"error": one line, "type": the segue.errors class}`` with the
status of :data:`STATUS`, worded for the API (:mod:`.wording`); a 4xx never wrote
anything. Every route checks the token and the body's size before FastAPI reads
the body (:class:`.security.GuardedRoute`). Every mutation goes
through the client with the principal as the actor, so its event names who
(a pool change is recorded in the host pool's ``pool_changes``, not a run's events).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import errors
from ..client.base import MAX_POOL_CHANGES
from ..client.local import LocalClient
from ..home import Home
from ..placement.policy import priority_class
from ..run.logs import check_step
from .auth import Principal, Role, parse_classes
from .security import GuardedRoute, Security
from .wording import api_message

# The HTTP status of each error class (the nearest ancestor listed wins).
STATUS: dict[type[errors.SegueError], int] = {
    errors.UnknownRunError: 404,
    errors.NotFoundError: 404,
    errors.RunExistsError: 409,
    errors.RunStateError: 409,
    errors.ControllerConflictError: 409,
    errors.CodeChangedError: 409,
    errors.SinkOwnedError: 409,
    errors.ConflictError: 409,
    errors.WaitTimeoutError: 408,
    errors.PermissionDeniedError: 403,
    errors.UsageError: 400,
    errors.SegueError: 500,
}


def status_of(exc: errors.SegueError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]  # type: ignore[index]
    return 500


def error_body(message: str, kind: str) -> dict[str, str]:
    return {"error": " ".join(message.split()), "type": kind}


def error_of(exc: errors.SegueError) -> dict[str, str]:
    """The answer's body for ``exc``: its message in the API's words, and the nearest
    class of :mod:`segue.errors` (the one an HTTP client can raise again)."""
    kind = next(c.__name__ for c in type(exc).__mro__ if c.__module__ == errors.__name__)
    return error_body(api_message(str(exc)), kind)


# The segue.errors class of each refusal the HTTP layer makes itself (by status).
_HTTP_KIND: dict[int, type[errors.SegueError]] = {
    401: errors.PermissionDeniedError, 403: errors.PermissionDeniedError, 404: errors.NotFoundError,
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not ignored


class SubmitBody(_Body):
    flow: str = Field(max_length=4096,  # PATH_MAX: a longer one names no file
                      description="path of the flow file on the server's machine")
    params: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = None
    priority: str | int | None = None
    gpus: int | None = Field(default=None, ge=0)
    gpu_memory: str | int | None = None
    preemptible: bool | None = None
    max_pause: str | float | None = None
    pause_deadline_s: float | None = Field(default=None, ge=0)
    pause_on_failure: bool | None = None
    on_input_change: Literal["fail", "pin", "include-new"] | None = None
    on_env_change: Literal["fail", "warn", "allow"] | None = None
    checkpoints: str | None = Field(default=None, max_length=4096,
                                    description="path or URL (s3://bucket/prefix) for checkpoints")
    options: dict[str, Any] = Field(default_factory=dict)


class PauseBody(_Body):
    wait: bool = False
    timeout: float | None = Field(default=None, ge=0, le=3600)


class ResumeBody(_Body):
    allow_code_change: bool = False
    restart_step: str | None = None
    on_input_change: Literal["fail", "pin", "include-new"] | None = None
    on_env_change: Literal["fail", "warn", "allow"] | None = None


# A size in bytes the pool can store (SQLite INTEGER): beyond it, or negative, a 422, not a 500.
_Bytes = Annotated[int, Field(ge=0, le=2**63 - 1)]


_GpuType = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")]


class GpuGroup(_Body):
    """More devices after the first ``gpus``: ``count`` of ``memory`` each, of ``type``."""

    count: int = Field(ge=0, le=1024)
    memory: _Bytes | str
    type: _GpuType | None = None


class PoolBody(_Body):
    gpus: int = Field(ge=0, le=1024)
    gpu_memory: _Bytes | str = "80GB"
    cpus: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # inf would be stored, then unservable
    memory: _Bytes | str | None = None
    gpu_type: _GpuType | None = None  # for steps with an accelerator= hint, e.g. "rtx-pro-6000"
    groups: list[GpuGroup] = Field(default_factory=list, max_length=16)


class TokenBody(_Body):
    name: str = Field(min_length=1, max_length=64)
    role: Literal["viewer", "operator", "admin"]
    may_pause: list[str] | None = Field(default=None, max_length=16,
                                        description="priority classes, or ['*'] (default: all)")
    may_resume: list[str] | None = Field(default=None, max_length=16)


RunId = Annotated[str, Query(min_length=1, max_length=128)]


def create_app(home: Home, *, pool: str | os.PathLike[str] | None = None, auth: bool = True,
               allowed_origins: tuple[str, ...] = ()) -> FastAPI:
    """The server's app over ``home``; ``auth=False`` only for a loopback bind (the CLI checks)."""
    app = FastAPI(title="segue", version=_version(), docs_url="/api/docs", openapi_url="/api/openapi.json",
                  redoc_url=None)
    app.router.route_class = GuardedRoute  # every route added from here on, the extensions' too
    sec = Security(home, auth=auth, allowed_origins=allowed_origins)
    base = LocalClient(home, pool=pool)
    app.state.home = home
    app.state.security = sec

    # Every request's client shares base's store and pool connections (one per thread),
    # opened at the first request that needs them.
    def client_for(p: Principal) -> LocalClient:
        return base.acting_as(p.actor)

    viewer = Depends(sec.require(Role.VIEWER))
    operator = Depends(sec.require(Role.OPERATOR, mutation=True))
    admin = Depends(sec.require(Role.ADMIN, mutation=True))
    admin_reader = Depends(sec.require(Role.ADMIN))  # reads only admins may make
    streamer = Depends(sec.require(Role.VIEWER, stream=True))  # event streams check Origin too

    @app.exception_handler(errors.SegueError)
    async def _segue_error(request: Request, exc: errors.SegueError) -> JSONResponse:
        return JSONResponse(error_of(exc), status_code=status_of(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        if first.get("type") == "json_invalid":
            why = (first.get("ctx") or {}).get("error", "JSON decode error")
            message = (f"the body is not valid JSON ({why} at character {first.get('loc', ('?',))[-1]}); "
                       f"send a JSON object")
        else:
            loc = first.get("loc", ())
            where = ".".join(str(x) for x in loc if x not in ("body", "query", "path"))
            message = f"invalid {where or (loc[0] if loc else 'request')}: {first.get('msg', 'invalid')}"
        return JSONResponse(error_body(message, errors.UsageError.__name__), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, message = exc.status_code, str(exc.detail)
        if code == 404 and message == "Not Found":  # the router's own: no route has this path
            message = f"no route {request.url.path}; the API's routes are listed at /api/docs"
        elif code == 405 and message == "Method Not Allowed":
            message = (f"{request.url.path} does not take {request.method}; the API's routes and their "
                       f"methods are listed at /api/docs")
        kind = _HTTP_KIND.get(code, errors.UsageError if code < 500 else errors.SegueError)
        return JSONResponse(error_body(message, kind.__name__), status_code=code,
                            headers=getattr(exc, "headers", None))

    def check_may(p: Principal, action: str, run: str | None = None, priority: int | None = None) -> None:
        if priority is None:
            priority = base.summary(_run_id(run or "")).priority
        cls = priority_class(priority)
        if not p.may(action, cls):
            raise errors.PermissionDeniedError(f"token {p.name!r} may not {action} runs of class {cls!r}; "
                                               f"ask an admin for a token whose may_{action} includes {cls!r}")

    # -- runs --------------------------------------------------------------------

    @app.get("/api/runs")
    def list_runs(p: Principal = viewer, state: list[str] | None = Query(None),
                  flow: str | None = Query(None, max_length=256),
                  limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0)) -> JSONResponse:
        rows = client_for(p).runs(state=state, flow=flow, limit=limit, offset=offset)
        return JSONResponse([r.to_json() for r in rows])

    @app.post("/api/runs", status_code=201)
    def submit(body: SubmitBody, p: Principal = operator) -> JSONResponse:
        from ..placement.policy import parse_priority

        given = body.priority if body.priority is not None else body.options.get("priority", 100)
        prio = parse_priority(given if isinstance(given, str | int) else 100)  # a bad type fails in submit
        check_may(p, "resume", priority=prio)
        kw = body.model_dump(exclude={"flow", "params"})
        summary = client_for(p).submit(body.flow, body.params, **kw)
        return JSONResponse(summary.to_json(), status_code=201)

    @app.get("/api/runs/{run_id}")
    def status(run_id: str, p: Principal = viewer) -> JSONResponse:
        return JSONResponse(client_for(p).status(_run_id(run_id)).to_json())

    @app.post("/api/runs/{run_id}/pause")
    def pause(run_id: str, body: PauseBody | None = None, p: Principal = operator) -> JSONResponse:
        body = body or PauseBody()
        check_may(p, "pause", run_id)
        return JSONResponse(client_for(p).pause(run_id, wait=body.wait, timeout=body.timeout).to_json())

    @app.post("/api/runs/{run_id}/resume")
    def resume(run_id: str, body: ResumeBody | None = None, p: Principal = operator) -> JSONResponse:
        body = body or ResumeBody()
        check_may(p, "resume", run_id)
        if body.restart_step is not None:
            check_step(body.restart_step)  # an unsafe name is a 400; one the run lacks, a 404
        return JSONResponse(client_for(p).resume(run_id, **body.model_dump()).to_json())

    @app.post("/api/runs/{run_id}/cancel")
    def cancel(run_id: str, p: Principal = operator) -> JSONResponse:
        check_may(p, "pause", run_id)
        return JSONResponse(client_for(p).cancel(run_id).to_json())

    @app.post("/api/runs/{run_id}/checkpoint")
    def checkpoint_now(run_id: str, p: Principal = operator) -> JSONResponse:
        check_may(p, "pause", run_id)
        return JSONResponse({"asked": client_for(p).checkpoint_now(run_id)})

    @app.get("/api/runs/{run_id}/events", response_model=None)
    def events(request: Request, run_id: str, p: Principal = streamer,
               after: int = Query(0, ge=0, le=2**63 - 1), follow: bool = False) -> Any:  # SQLite's int
        c = client_for(p)
        if follow:  # Server-Sent Events; a reconnecting browser sends Last-Event-ID
            last = request.headers.get("last-event-id", "")
            start = max(after, int(last)) if last.isdigit() else after
            it = c.events(_run_id(run_id), after=start, follow=True)
            return StreamingResponse(_sse(it, lambda e: (str(e.id), "event", asdict(e))),
                                     media_type="text/event-stream", headers=_NO_BUFFER)
        return JSONResponse([asdict(e) for e in c.events(_run_id(run_id), after=after)])

    @app.get("/api/runs/{run_id}/progress", response_model=None)
    def progress(run_id: str, p: Principal = streamer, poll_s: float = Query(0.5, ge=0.1, le=10)) -> Any:
        """Server-Sent Events: the run's status each time it changes, until the run rests."""
        c = client_for(p)
        first = c.status(_run_id(run_id))  # an unknown run is a 404 now, not inside the stream
        return StreamingResponse(_sse(_progress(c, first, poll_s), lambda d: (None, "status", d)),
                                 media_type="text/event-stream", headers=_NO_BUFFER)

    @app.get("/api/runs/{run_id}/checkpoints")
    def checkpoints(run_id: str, p: Principal = viewer) -> JSONResponse:
        return JSONResponse([asdict(c) for c in client_for(p).checkpoints(_run_id(run_id))])

    @app.get("/api/runs/{run_id}/environment")
    def environment(run_id: str, p: Principal = viewer) -> JSONResponse:
        return JSONResponse(client_for(p).environment(_run_id(run_id)))

    @app.get("/api/runs/{run_id}/metrics")
    def metrics(run_id: str, p: Principal = viewer, step: str | None = Query(None, max_length=64),
                since: float | None = Query(None, allow_inf_nan=False)) -> JSONResponse:
        points = client_for(p).metrics(_run_id(run_id), None if step is None else check_step(step),
                                       since=since)
        return JSONResponse([asdict(m) for m in points])

    @app.get("/api/runs/{run_id}/steps/{step}/output")
    def output(run_id: str, step: str, p: Principal = viewer) -> JSONResponse:
        value = client_for(p).output(_run_id(run_id), check_step(step))
        return JSONResponse({"run_id": run_id, "step": step, "value": value})

    @app.get("/api/runs/{run_id}/logs", response_model=None)
    def logs(run_id: str, p: Principal = streamer,
             step: str | None = Query(None, max_length=64), attempt: int | None = Query(None, ge=1),
             follow: bool = False) -> Any:
        c = client_for(p)
        if step is not None:
            check_step(step)
        elif attempt is not None:
            raise errors.UsageError("attempt names an attempt of one step: give step too "
                                    "(?step=STEP&attempt=N)")
        # Both calls check the run, the step and the attempt before they return: inside a
        # stream an error could only cut the answer short.
        if follow:
            text = c.logs(_run_id(run_id), step, attempt=attempt, follow=True)
            return StreamingResponse(_sse(text, lambda t: (None, "log", {"text": t})),
                                     media_type="text/event-stream", headers=_NO_BUFFER)
        return StreamingResponse(c.log_bytes(_run_id(run_id), step, attempt=attempt),
                                 media_type="text/plain; charset=utf-8")

    # -- pool ---------------------------------------------------------------------

    @app.get("/api/pool")
    def get_pool(p: Principal = viewer) -> JSONResponse:
        return JSONResponse(client_for(p).pool().to_json())

    @app.put("/api/pool")
    def set_pool(body: PoolBody, p: Principal = admin) -> JSONResponse:
        view = client_for(p).configure_pool(
            gpus=body.gpus, gpu_memory=body.gpu_memory, cpus=body.cpus, memory=body.memory,
            gpu_type=body.gpu_type, groups=[(g.count, g.memory, g.type) for g in body.groups])
        return JSONResponse(view.to_json())

    @app.get("/api/pool/changes")
    def pool_changes(p: Principal = viewer,
                     limit: int = Query(100, ge=1, le=MAX_POOL_CHANGES)) -> JSONResponse:
        return JSONResponse([asdict(c) for c in client_for(p).pool_changes(limit=limit)])

    # -- tokens --------------------------------------------------------------------

    @app.get("/api/tokens")
    def list_tokens(p: Principal = admin_reader, revoked: bool = False) -> JSONResponse:
        return JSONResponse(sec.tokens.records(revoked=revoked))

    @app.post("/api/tokens", status_code=201)
    def create_token(body: TokenBody, p: Principal = admin) -> JSONResponse:
        def classes(given: list[str] | None) -> list[str] | None:
            return None if given is None else parse_classes(",".join(given))

        role = Role.parse(body.role)
        token = sec.tokens.create(body.name, role, may_pause=classes(body.may_pause),
                                  may_resume=classes(body.may_resume), actor=p.actor)
        return JSONResponse({"name": body.name, "role": role.name.lower(), "token": token},
                            status_code=201, headers={"Cache-Control": "no-store"})

    @app.delete("/api/tokens/{name}")
    def revoke_token(name: str, p: Principal = admin) -> JSONResponse:
        sec.tokens.revoke(name, actor=p.actor, keep_an_admin=True)
        return JSONResponse({"name": name, "revoked_by": p.actor})

    @app.get("/api/queue")
    def get_queue(p: Principal = viewer) -> JSONResponse:
        return JSONResponse([q.to_json() for q in client_for(p).queue()])

    @app.get("/api/whoami")
    def whoami(p: Principal = viewer) -> JSONResponse:
        return JSONResponse(p.to_json())

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    for extend in _EXTENSIONS:
        extend(app, client_for, sec)
    return app


# Optional parts (the web UI, /metrics) register themselves here: each gets the
# app, a function from a principal to its client, and the security object.
_EXTENSIONS: list[Callable[[FastAPI, Callable[[Principal], LocalClient], Security], None]] = []


_NO_BUFFER = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def _run_id(run_id: str) -> str:
    from ..home import check_run_id

    return check_run_id(run_id)


def _sse(items: Iterator[Any], frame: Callable[[Any], tuple[str | None, str, Any]]) -> Iterator[bytes]:
    yield b": segue event stream\n\n"  # flushes the headers at once
    try:
        for item in items:
            ident, kind, data = frame(item)
            head = f"id: {ident}\n" if ident is not None else ""
            yield f"{head}event: {kind}\ndata: {json.dumps(data, default=str)}\n\n".encode()
    except errors.SegueError as exc:  # after the 200 header: say it in the stream, end it cleanly
        body = error_of(exc)
        yield f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    yield b"event: end\ndata: {}\n\n"


def _progress(c: LocalClient, first: Any, poll_s: float) -> Iterator[dict[str, Any]]:
    """Status documents, one per change (state, progress, checkpoints), until the run rests."""
    import time

    from ..client.base import RESTING

    st, last = first, None
    while True:
        doc = st.to_json()
        key = json.dumps([doc["state"], doc["updated_at"], [(s["state"], s["progress"], s["last_checkpoint"])
                                                           for s in doc["steps"]]], default=str)
        if key != last:
            yield doc
            last = key
        if st.state in RESTING:
            return
        time.sleep(poll_s)
        st = c.status(st.run_id)


def _version() -> str:
    from .._version import __version__

    return __version__


def home_file(home: Home, relative: str) -> Path:
    """A path inside the home, or UsageError: every file the server serves goes through here."""
    root = home.root.resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise errors.UsageError(f"path {relative!r} is outside the home; refused")
    return target
