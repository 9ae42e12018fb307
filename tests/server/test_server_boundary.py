"""What a real `segue server` does with a request before a handler sees it.

- Every mutating route checks the token and the role before it reads the body: a
  malformed body gets the 401 (no token) or the 403 (a viewer), never a 422.
- A body over the limit is refused before the server reads it: 401 without a
  token, 413 with one, with a declared Content-Length and chunked alike; the
  server's peak memory (VmHWM, reset before each request) shows it held none of it.
- An error answer names its :mod:`segue.errors` class and speaks the API's terms
  (JSON fields, requests), while the CLI keeps its own words for the same error.
- A step or attempt name that is unsafe is a 400 and one the run lacks a 404, in
  the UI as in the API: never the page of another step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
from segue_helpers import FLOWS, wait_for  # noqa: E402
from serverkit import ServerProcess  # noqa: E402

from segue import errors  # noqa: E402

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
# The only mutating routes anyone may call: logging in (the form carries the token) and out.
OPEN = {("POST", "/login"), ("POST", "/logout")}
MiB = 1 << 20
BIG = 64 * MiB


def _routes() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The mutating routes that need a token, and the routes that read a body, from the app."""
    from segue.home import Home
    from segue.server import create_app

    app = create_app(Home(Path("/nonexistent/segue-boundary-home")), pool="/nonexistent/pool.db")
    found = sorted((m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ()) if m in MUTATING)
    assert OPEN <= set(found), "the open routes moved: update OPEN"
    bodies = sorted((m, r.path) for r in app.routes if getattr(r, "body_field", None) is not None
                    for m in r.methods)  # type: ignore[attr-defined]
    return [r for r in found if r not in OPEN], [*bodies, ("POST", "/login")]  # /login reads its form


ROUTES, READ_A_BODY = _routes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server, a viewer token, a finished run `done` (steps count and report) and a
    paused one, `paused`, that a resume may restart a step of."""
    root = tmp_path_factory.mktemp("boundary")
    srv = ServerProcess(root / "home", root / "pool.db", root).start()
    try:
        srv.viewer = srv.create_token("vera", "viewer")  # type: ignore[attr-defined]
        with srv.client(timeout=60) as c:
            r = c.post("/api/runs", json={"flow": str(FLOWS / "counter.py"), "run_id": "done",
                                          "params": {"n": 5, "sleep": 0}}, headers={"Origin": srv.url})
            assert r.status_code == 201, r.text
            r = c.post("/api/runs", json={"flow": str(FLOWS / "counter.py"), "run_id": "paused", "params": {
                "n": 5, "sleep": 0, "hold": str(root / "never")}}, headers={"Origin": srv.url})
            assert r.status_code == 201, r.text
            wait_for(lambda: c.get("/api/runs/done").json()["state"] == "SUCCEEDED", 180, "run done to succeed")
            r = c.post("/api/runs/paused/pause", json={"wait": True, "timeout": 180}, headers={"Origin": srv.url})
            assert r.status_code == 200 and r.json()["state"] == "PAUSED", r.text
        yield srv
        assert srv.proc is not None and srv.proc.poll() is None, f"the server died:\n{srv.stderr()}"
    finally:
        srv.stop()


def _path(template: str) -> str:
    return template.replace("{run_id}", "done").replace("{name}", "nobody")


def _error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    cls = getattr(errors, body.get("type", ""), None)
    assert isinstance(cls, type) and issubclass(cls, errors.SegueError), f"not a segue.errors class: {body}"
    return body  # type: ignore[no-any-return]


# -- 1. the token before the body ------------------------------------------------------------


@pytest.mark.parametrize(("method", "route"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_a_mutating_route_checks_the_token_before_it_reads_the_body(server: ServerProcess, method: str,
                                                                   route: str) -> None:
    malformed = {"content": b'{"flow": not json', "headers": {"Content-Type": "application/json",
                                                              "Origin": server.url}}
    r = httpx.request(method, server.url + _path(route), timeout=60, **malformed)  # type: ignore[arg-type]
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert _error(r)["type"] == "PermissionDeniedError"
    with server.client(server.viewer, timeout=60) as c:  # type: ignore[attr-defined]
        r = c.request(method, _path(route), **malformed)  # type: ignore[arg-type]
    assert r.status_code == 403, r.text  # the role too comes before the body
    assert _error(r)["type"] == "PermissionDeniedError"


# -- 3. the body's size, before it is read ---------------------------------------------------------


def _peak_reset(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _big_body(chunked: bool) -> bytes | Iterator[bytes]:
    """64 MiB of a submit whose flow path is all 'a': JSON the server would parse in full."""
    head, tail, piece = b'{"flow": "', b'"}', b"a" * MiB

    def chunks() -> Iterator[bytes]:
        yield head
        for _ in range(BIG // MiB):
            yield piece
        yield tail

    return chunks() if chunked else b"".join(chunks())  # an iterator: httpx sends it chunked


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("token", [False, True], ids=["no-token", "admin"])
def test_a_large_body_is_refused_before_the_server_reads_it(server: ServerProcess, token: bool,
                                                            chunked: bool) -> None:
    headers = {"Content-Type": "application/json", "Origin": server.url,
               **(server.headers if token else {})}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as c:
        c.post("/api/runs", content=b"{}")  # warm: the route's first answer allocates what it needs
        _peak_reset(server.pid)
        before = _rss(server.pid)
        r = c.post("/api/runs", content=_big_body(chunked))
    grew = _peak(server.pid) - before
    if token:
        assert r.status_code == 413, r.text
        assert _error(r)["type"] == "UsageError" and f"{MiB} bytes" in r.json()["error"]
    else:
        assert r.status_code == 401, r.text
    # It read at most the limit (1 MiB) of the 64: the peak stayed well under the body.
    assert grew < 16 * MiB, f"the server's peak memory grew {grew / MiB:.0f} MiB for a {BIG // MiB} MiB body"
    with server.client(timeout=60) as c:
        assert c.get("/api/runs/done").status_code == 200  # and it serves on


def test_the_limit_is_one_mib_on_every_route(server: ServerProcess) -> None:
    own = {"Origin": server.url, "Content-Type": "application/json"}
    under = b'{"flow": "/nonexistent.py", "params": {"pad": "' + b"a" * (MiB - 100) + b'"}}'
    over = b'{"flow": "' + b"a" * MiB + b'"}'
    assert ("POST", "/api/runs") in READ_A_BODY and ("PUT", "/api/pool") in READ_A_BODY
    with server.client(timeout=60) as c:
        r = c.post("/api/runs", content=under, headers=own)
        assert r.status_code == 400 and r.json()["type"] == "FlowError", r.text  # read, parsed, refused
        # A declared length over the limit: refused at once, whatever the route.
        for method, route in [*ROUTES, ("GET", "/api/runs"), ("GET", "/"), ("POST", "/login")]:
            r = c.request(method, _path(route), content=over, headers=own)
            assert r.status_code == 413, f"{method} {route}: {r.status_code} {r.text}"
        # No length (chunked): counted as it is read, by every route that reads a body.
        for method, route in READ_A_BODY:
            r = c.request(method, _path(route), content=iter([over]), headers=own)
            assert r.status_code == 413, f"{method} {route} (chunked): {r.status_code} {r.text}"


# -- 2. the class and the words of an error ----------------------------------------------------------


def test_api_errors_name_their_class_and_speak_in_json_fields(server: ServerProcess) -> None:
    flow = str(FLOWS / "counter.py")
    own = {"Origin": server.url}
    anon = httpx.Client(base_url=server.url, timeout=60)
    with server.client(timeout=60) as c, server.client(server.viewer, timeout=60) as v:  # type: ignore[attr-defined]
        answers = {
            "no token": (anon.get("/api/runs"), 401, "PermissionDeniedError"),
            "viewer submits": (v.post("/api/runs", json={"flow": flow}, headers=own), 403,
                               "PermissionDeniedError"),
            "no route": (c.get("/api/nothing"), 404, "NotFoundError"),
            "no method": (c.delete("/api/runs", headers=own), 405, "UsageError"),
            "bad json": (c.post("/api/runs", content=b"{x", headers={**own, "Content-Type": "application/json"}),
                         422, "UsageError"),
            "bad field": (c.post("/api/runs", json={"flow": flow, "gpus": -1}, headers=own), 422, "UsageError"),
            "param type": (c.post("/api/runs", json={"flow": flow, "params": {"n": "x"}}, headers=own), 400,
                           "ParamError"),
            "run exists": (c.post("/api/runs", json={"flow": flow, "run_id": "done"}, headers=own), 409,
                           "RunExistsError"),
            "checkpoints": (c.post("/api/runs", json={"flow": flow, "checkpoints": "relative/dir"},
                                   headers=own), 400, "UsageError"),
            "unknown run": (c.get("/api/runs/nosuchrun"), 404, "UnknownRunError"),
            "long flow path": (c.post("/api/runs", json={"flow": "/" + "a" * 300}, headers=own), 400, "FlowError"),
            "attempt alone": (c.get("/api/runs/done/logs", params={"attempt": 1}), 400, "UsageError"),
            "no token name": (c.delete("/api/tokens/nobody", headers=own), 404, "NotFoundError"),
            "token exists": (c.post("/api/tokens", json={"name": "vera", "role": "viewer"}, headers=own), 400,
                             "UsageError"),
        }
    anon.close()
    for what, (r, status, kind) in answers.items():
        assert (r.status_code, _error(r)["type"]) == (status, kind), f"{what}: {r.status_code} {r.text}"
        message = r.json()["error"]
        assert "\n" not in message and message, what
        assert " --" not in message and not message.startswith("--"), f"{what}: CLI flag in {message!r}"
        assert "`segue " not in message.replace("`segue token create NAME` on the server's host", ""), \
            f"{what}: CLI command in {message!r}"
    words = {what: r.json()["error"] for what, (r, _, _) in answers.items()}
    assert '"params": {"n": <int>}' in words["param type"]
    assert '"run_id"' in words["run exists"] and "POST /api/runs/done/resume" in words["run exists"]
    assert words["checkpoints"].startswith('"checkpoints"')
    assert "GET /api/runs lists" in words["unknown run"]
    assert "GET /api/tokens" in words["no token name"] and "DELETE /api/tokens/vera" in words["token exists"]
    assert words["bad json"].startswith("the body is not valid JSON")


def test_the_cli_keeps_its_own_words(server: ServerProcess) -> None:
    env = {**os.environ, "SEGUE_POOL": str(server.pool)}
    proc = subprocess.run([sys.executable, "-m", "segue", "--home", str(server.home), "run",
                           str(FLOWS / "counter.py"), "--param", "n=x"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == errors.EXIT_USAGE, proc.stderr
    assert "pass --param n=<int>" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "segue", "--home", str(server.home), "token", "revoke",
                           "nobody"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == errors.EXIT_USAGE and "`segue token list` shows them" in proc.stderr


# -- 4. step and attempt names ----------------------------------------------------------------------

NAMES = [  # (route, query or body, the status)
    ("GET /runs/done", "step=../../../secret&attempt=1", 400),
    ("GET /runs/done", "step=%2e%2e/secret", 400),
    ("GET /runs/done", "step=/etc/passwd", 400),
    ("GET /runs/done", "step=nope", 404),
    ("GET /runs/done", "step=count&attempt=99", 404),
    ("GET /runs/done", "attempt=99", 404),
    ("GET /runs/done", "step=count&attempt=1", 200),
    ("GET /api/runs/done/logs", "step=../../../secret&attempt=1", 400),
    ("GET /api/runs/done/logs", "step=%2e%2e/secret", 400),
    ("GET /api/runs/done/logs", "step=/etc/passwd", 400),
    ("GET /api/runs/done/logs", "step=nope", 404),
    ("GET /api/runs/done/logs", "step=count&attempt=99", 404),
    ("GET /api/runs/done/logs", "step=count&attempt=1", 200),
    ("GET /api/runs/done/steps/%2e%2e/output", "", 400),
    ("GET /api/runs/done/steps/nope/output", "", 404),
    ("GET /api/runs/done/steps/count/output", "", 200),
    ("POST /api/runs/paused/resume", '{"restart_step": "../../secret"}', 400),
    ("POST /api/runs/paused/resume", '{"restart_step": "nope"}', 404),
]


@pytest.mark.parametrize(("route", "given", "status"), NAMES, ids=[f"{r}?{g}" for r, g, _ in NAMES])
def test_an_unsafe_step_name_is_a_400_and_an_unknown_one_a_404(server: ServerProcess, route: str, given: str,
                                                              status: int) -> None:
    method, path = route.split(" ")
    with server.client(timeout=60) as c:
        if method == "POST":
            r = c.post(path, content=given.encode(), headers={"Origin": server.url,
                                                              "Content-Type": "application/json"})
        else:  # the query exactly as written: %2e%2e stays encoded on the wire
            r = c.get(httpx.URL(server.url + path + (f"?{given}" if given else "")))
    assert r.status_code == status, f"{route}?{given}: {r.status_code} {r.text[:300]}"
    if status != 200 and path.startswith("/api/"):
        assert _error(r)["type"] == ("UsageError" if status == 400 else "NotFoundError")
    if status != 200 and not path.startswith("/api/"):  # the page says why, and shows no run
        assert ("is invalid" if status == 400 else "there is no" if "attempt=" in given else "has no step") in r.text


def test_the_api_words_the_refusals_of_resume_and_restart_as_requests() -> None:
    """Refusals a test server cannot easily provoke (a changed input, a quarantined step),
    built by the classes and functions that raise them, in the words the API gives them."""
    from segue.run.restart import no_valid_checkpoint
    from segue.server.app import error_of

    cases = {
        errors.InputChangedError("read", ["a.txt added"], accepts=("pin", "include-new")):
            ['"on_input_change": "pin"', '"on_input_change": "include-new"'],
        errors.InputChangedError("read", ["a.txt changed"]): ['"restart_step": "read"'],
        no_valid_checkpoint("r", "train", 2, "all were quarantined"):
            ['POST /api/runs/r/resume with {"restart_step": "train"}'],
        errors.WaitTimeoutError("r", "RUNNING", ["PAUSED"], 5): ["GET /api/runs/r"],
        errors.CodeChangedError("the code of run 'r' changed since it began (x); restore the original "
                                "file or pass --allow-code-change"): ['"allow_code_change": true'],
    }
    for exc, phrases in cases.items():
        body = error_of(exc)
        assert body["type"] == type(exc).__name__
        assert "--" not in body["error"] and "`segue " not in body["error"], body
        for phrase in phrases:
            assert phrase in body["error"], (phrase, body)
        assert "--" in str(exc) or "`segue " in str(exc)  # the CLI's words are unchanged
