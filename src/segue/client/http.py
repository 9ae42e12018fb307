"""``HttpClient``: the client contract over `segue server`'s REST API (httpx).

It returns the same records and raises the same :mod:`segue.errors` classes
as :class:`~segue.client.local.LocalClient`: the server sends each error's
class name, and the client raises that class with the server's message.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from .. import errors
from ..states import RunState
from .base import BaseClient, check_changes_limit
from .records import (
    CheckpointRecord,
    Event,
    MetricPoint,
    PoolChange,
    PoolView,
    QueueEntry,
    RunStatus,
    RunSummary,
    checkpoint_from_json,
    event_from_json,
    metric_point_from_json,
    pool_change_from_json,
)


def _raise_for(resp: Any) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
    except ValueError:
        body = {"error": resp.text.strip()[:300]}
    _raise_error(body if isinstance(body, dict) else {}, resp.status_code)


def _raise_error(body: dict[str, Any], status: int) -> None:
    message, kind = str(body.get("error", "")), str(body.get("type", ""))
    found = getattr(errors, kind, None)
    cls: type[errors.SegueError]
    if isinstance(found, type) and issubclass(found, errors.SegueError):
        cls = found
    else:
        cls = {401: errors.PermissionDeniedError, 403: errors.PermissionDeniedError, 404: errors.UnknownRunError,
               408: errors.WaitTimeoutError, 409: errors.ConflictError}.get(
            status, errors.UsageError if status < 500 else errors.SegueError)
    exc = cls.__new__(cls)  # the server already wrote the message; constructors differ
    Exception.__init__(exc, message or f"server answered {status}")
    raise exc


class HttpClient(BaseClient):
    """Talk to a `segue server` at ``url`` with a bearer ``token``."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        import httpx

        if not url.startswith(("http://", "https://")):
            raise errors.UsageError(f"server url {url!r} must start with http:// or https://")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                  follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise errors.SegueError(f"cannot reach segue server at {self.url} ({exc}); "
                                    f"is `segue server` running?") from None
        _raise_for(resp)
        return resp.json()

    @staticmethod
    def _run(run: str) -> str:
        return "/api/runs/" + quote(run, safe="")

    # -- commands ---------------------------------------------------------------------

    def submit(self, flow: str, params: Mapping[str, Any] | None = None, **kw: Any) -> RunSummary:
        body = {"flow": flow, "params": dict(params or {}),
                **{k: v for k, v in kw.items() if v is not None}}
        if "options" in body:
            body["options"] = dict(body["options"])
        return RunSummary.from_json(self._call("POST", "/api/runs", json=body))

    def pause(self, run: str, *, wait: bool = False, timeout: float | None = None) -> RunSummary:
        return RunSummary.from_json(self._call("POST", self._run(run) + "/pause",
                                               json={"wait": wait, "timeout": timeout}))

    def resume(self, run: str, *, allow_code_change: bool = False, restart_step: str | None = None,
               on_input_change: str | None = None, on_env_change: str | None = None) -> RunSummary:
        return RunSummary.from_json(self._call("POST", self._run(run) + "/resume", json={
            "allow_code_change": allow_code_change, "restart_step": restart_step,
            "on_input_change": on_input_change, "on_env_change": on_env_change}))

    def cancel(self, run: str) -> RunSummary:
        return RunSummary.from_json(self._call("POST", self._run(run) + "/cancel"))

    def checkpoint_now(self, run: str) -> list[str]:
        return [str(s) for s in self._call("POST", self._run(run) + "/checkpoint")["asked"]]

    # -- reading ----------------------------------------------------------------------

    def status(self, run: str) -> RunStatus:
        return RunStatus.from_json(self._call("GET", self._run(run)))

    def runs(self, *, state: str | RunState | Collection[str | RunState] | None = None,
             flow: str | None = None, limit: int | None = None, offset: int = 0) -> list[RunSummary]:
        states = None if state is None else [state] if isinstance(state, str | RunState) else list(state)
        if limit == 0:
            return []  # as a home answers; the server pages by 1 to 1000
        params: dict[str, Any] = {"offset": offset, "limit": 1000 if limit is None else limit}
        if states:
            params["state"] = [str(getattr(s, "value", s)) for s in states]
        if flow is not None:
            params["flow"] = flow
        out: list[RunSummary] = []
        while True:  # the server pages by 1000 at most
            rows = self._call("GET", "/api/runs", params=params)
            out += [RunSummary.from_json(r) for r in rows]
            if limit is not None or len(rows) < params["limit"]:
                return out
            params["offset"] += len(rows)

    def events(self, run: str, *, after: int = 0, follow: bool = False) -> Iterator[Event]:
        if not follow:
            return iter([event_from_json(e) for e in self._call("GET", self._run(run) + "/events",
                                                                 params={"after": after})])
        self.summary(run)  # an unknown run is an error now, not at the first next()
        return (event_from_json(data) for kind, data in self._sse(self._run(run) + "/events",
                                                                  {"after": after, "follow": "true"})
                if kind == "event")

    def _sse(self, path: str, params: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        with self._http.stream("GET", path, params=params, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            kind, data = "message", []
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    if kind == "end":
                        return
                    if kind == "error":  # the server hit an error after it began the stream
                        _raise_error(json.loads("\n".join(data)), 500)
                    yield kind, json.loads("\n".join(data))
                    kind, data = "message", []

    def checkpoints(self, run: str) -> list[CheckpointRecord]:
        return [checkpoint_from_json(c) for c in self._call("GET", self._run(run) + "/checkpoints")]

    def environment(self, run: str) -> dict[str, Any]:
        return dict(self._call("GET", self._run(run) + "/environment"))

    def metrics(self, run: str, step: str | None = None, *,
                since: float | None = None) -> list[MetricPoint]:
        params = {k: v for k, v in (("step", step), ("since", since)) if v is not None}
        return [metric_point_from_json(p) for p in
                self._call("GET", self._run(run) + "/metrics", params=params)]

    def output(self, run: str, step: str) -> Any:
        return self._call("GET", f"{self._run(run)}/steps/{quote(step, safe='')}/output")["value"]

    def logs(self, run: str, step: str | None = None, *, attempt: int | None = None,
             follow: bool = False) -> Iterator[str]:
        params: dict[str, Any] = {}
        if step is not None:
            params["step"] = step
        if attempt is not None:
            params["attempt"] = attempt
        if follow:
            params["follow"] = "true"
            return (data["text"] for kind, data in self._sse(self._run(run) + "/logs", params)
                    if kind == "log")
        resp = self._http.get(self._run(run) + "/logs", params=params)
        _raise_for(resp)
        return iter([resp.text] if resp.text else [])

    def pool(self) -> PoolView:
        return PoolView.from_json(self._call("GET", "/api/pool"))

    def configure_pool(self, *, gpus: int, gpu_memory: str | int = "80GB", cpus: float | None = None,
                       memory: str | int | None = None, gpu_type: str | None = None,
                       groups: Sequence[tuple[int, str | int, str | None]] = ()) -> PoolView:
        """As :meth:`LocalClient.configure_pool`, on the server's host (admin; recorded
        with this token's principal)."""
        body: dict[str, Any] = {"gpus": gpus, "gpu_memory": gpu_memory, "cpus": cpus, "memory": memory,
                                "gpu_type": gpu_type,
                                "groups": [{"count": n, "memory": m, "type": t} for n, m, t in groups]}
        return PoolView.from_json(self._call("PUT", "/api/pool", json=body))

    def pool_changes(self, *, limit: int = 100) -> list[PoolChange]:
        if check_changes_limit(limit) == 0:
            return []  # as a home answers; the server takes 1 to 1000
        return [pool_change_from_json(c) for c in self._call("GET", "/api/pool/changes",
                                                             params={"limit": limit})]

    def queue(self) -> list[QueueEntry]:
        return [QueueEntry.from_json(q) for q in self._call("GET", "/api/queue")]

    def __repr__(self) -> str:
        return f"HttpClient({self.url!r})"
