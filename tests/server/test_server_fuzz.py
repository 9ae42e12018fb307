"""Schemathesis against a real `segue server`: no input makes it fail (no 5xx, no broken answer).

Every operation of the OpenAPI document is fuzzed against a real server process
with the admin token (the role that may do everything, so no request stops at
the 403 gate): Schemathesis' examples, coverage (boundary and invalid values)
and fuzzing phases, at most ``SEGUE_FUZZ_EXAMPLES`` (default 50) generated
cases per operation, the same ones on every run unless ``SEGUE_FUZZ_RANDOM=1``. A case whose path names a run is sent twice: as generated
(almost always an unknown run: the 404 path) and with the id of a real
SUCCEEDED run of the home, so the code behind the 404 (steps, outputs, logs,
the refusals of pause/resume/cancel) is fuzzed too. Nothing is excluded.

Checked on every answer: ``not_a_server_error`` (no 5xx), and that the body
arrived whole: a stream that breaks after its 200 header (an error raised inside
a streaming answer) fails as a transport error.

The operations are collected from the app's own document (built in memory, no
server needed to collect); the test checks that the running server serves the
same one. Schemathesis' lazy ``from_fixture`` loader does not work with pytest 9
(it sets ``request.node._nodeid``), hence this shape.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from segue_helpers import FLOWS, wait_for
from serverkit import ServerProcess

pytest.importorskip("fastapi", reason="segue server needs the server extra (pip install 'segue[server]')")
schemathesis = pytest.importorskip("schemathesis", reason="the fuzz test needs schemathesis "
                                   "(pip install schemathesis)")
from schemathesis.checks import not_a_server_error  # noqa: E402

EXAMPLES = int(os.environ.get("SEGUE_FUZZ_EXAMPLES", "50"))
# The same cases on every run (a CI failure reproduces); SEGUE_FUZZ_RANDOM=1 explores new ones.
DERANDOMIZE = os.environ.get("SEGUE_FUZZ_RANDOM", "") != "1"


def _document() -> dict[str, Any]:
    from segue.home import Home
    from segue.server import create_app

    # The document does not depend on the home: an app over a path nothing writes to.
    return create_app(Home(Path("/nonexistent/segue-fuzz-home")), pool="/nonexistent/pool.db").openapi()


DOCUMENT = _document()
schema = schemathesis.openapi.from_dict(DOCUMENT)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fuzz")
    srv = ServerProcess(root / "home", root / "pool.db", root).start()
    try:
        with srv.client(timeout=60) as c:
            assert c.get("/api/openapi.json").json() == DOCUMENT, "the server serves another document"
            r = c.post("/api/runs", json={"flow": str(FLOWS / "counter.py"), "params": {"n": 5, "sleep": 0}})
            assert r.status_code == 201, r.text
            run = r.json()["run_id"]
            wait_for(lambda: c.get(f"/api/runs/{run}").json()["state"] == "SUCCEEDED", 180,
                     f"run {run} to succeed")
        srv.known_run = run  # type: ignore[attr-defined]
        yield srv
        # No request took the server down.
        assert srv.proc is not None and srv.proc.poll() is None, f"the server died:\n{srv.stderr()}"
    finally:
        srv.stop()


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
          # the per-test pool fixture is function-scoped; nothing in it changes between examples
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@schema.parametrize()
def test_no_input_makes_the_server_fail(case: Any, fuzz_server: ServerProcess) -> None:
    runs = [None]
    if "run_id" in (case.path_parameters or {}):
        runs.append(fuzz_server.known_run)  # type: ignore[attr-defined]
    for run in runs:
        if run is not None:
            case.path_parameters["run_id"] = run
        resp = case.call(base_url=fuzz_server.url, headers=fuzz_server.headers, timeout=60)
        case.validate_response(resp, checks=[not_a_server_error])


def test_the_fuzzed_server_still_answers(fuzz_server: ServerProcess) -> None:
    assert httpx.get(fuzz_server.url + "/healthz", timeout=30).status_code == 200
