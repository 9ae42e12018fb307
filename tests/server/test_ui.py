"""The web UI of `segue server`: pages over a real home with real runs, in-process.

FastAPI's TestClient speaks ASGI to the real app (API and UI together); the
runs are real counter runs driven by the CLI and the API. Waits poll the
store, never sleep.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
from fastapi.testclient import TestClient  # noqa: E402
from segue_helpers import FLOWS, Segue, wait_for  # noqa: E402

from segue.client.local import LocalClient  # noqa: E402
from segue.home import Home  # noqa: E402
from segue.server import create_app  # noqa: E402
from segue.server.auth import Role, TokenStore  # noqa: E402
from segue.server.ui import dag  # noqa: E402
from segue.store.base import NewRun  # noqa: E402

COUNTER = str(FLOWS / "counter.py")
BASE = "http://127.0.0.1:8765"
ORIGIN = {"Origin": BASE}
XSS = "<script>alert('x')</script>"


@pytest.fixture
def web(api: TestClient) -> TestClient:  # the app of tests/server/conftest.py, as a browser uses it
    return api


def login(c: TestClient, token: str) -> None:
    c.cookies.clear()
    r = c.post("/login", content=f"token={token}&next=/", headers={
        **ORIGIN, "Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    c.cookies.set("segue_token", token)  # the TestClient keeps Secure-less cookies for http


def buttons(html: str) -> set[str]:
    """The steering buttons on a page: (action, hidden?) folded to the visible ones."""
    return {m.group(1) for m in re.finditer(r'<button[^>]*data-action="(\w+)"(?![^>]*hidden)[^>]*>', html)}


def test_login_sets_a_strict_httponly_cookie_and_logout_clears_it(web: TestClient, tokens: dict[str, str]) -> None:
    r = web.get("/runs/x", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fruns%2Fx"
    page = web.get("/login?next=/runs/x")
    assert page.status_code == 200 and 'type="password"' in page.text and 'method="post"' in page.text
    r = web.post("/login", content="token=sgt_wrong&next=/", follow_redirects=False,
                 headers={**ORIGIN, "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 401 and "not valid" in r.text and "set-cookie" not in r.headers
    # Another site's form cannot log this browser in.
    r = web.post("/login", content=f"token={tokens['op']}", follow_redirects=False,
                 headers={"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = web.post("/login", content=f"token={tokens['op']}&next=//evil.example/x", follow_redirects=False,
                 headers={**ORIGIN, "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"segue_token={tokens['op']};")
    attrs = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "path=/", "samesite=strict"} <= attrs and "secure" not in attrs  # plain http here
    assert tokens["op"] not in r.headers["location"]
    web.cookies.set("segue_token", tokens["op"])
    home = web.get("/")
    assert home.status_code == 200 and "op · operator" in home.text
    r = web.post("/logout", headers=ORIGIN, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert r.headers["set-cookie"].startswith('segue_token="";') and "Max-Age=0" in r.headers["set-cookie"]
    # A token in the URL is refused: the page asks for the login form instead.
    web.cookies.clear()
    r = web.get(f"/?token={tokens['op']}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_pages_of_a_real_run_escape_everything(web: TestClient, tokens: dict[str, str], segue: Segue) -> None:
    segue("run", COUNTER, "--run-id", "esc1", "-p", "n=60", "-p", "sleep=0.005", "-p", f"fail_marker={XSS}",
          check=True)
    login(web, tokens["viewer"])
    runs = web.get("/")
    assert runs.status_code == 200 and 'href="/runs/esc1"' in runs.text and "SUCCEEDED" in runs.text
    page = web.get("/runs/esc1")
    assert page.status_code == 200, page.text
    html = page.text
    assert XSS not in html and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    assert re.search(r"<script\b", html.replace('<script src="/static/segue.js" defer></script>', "")) is None
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    # The DAG has both steps and the edge count -> report (read from the flow file).
    assert 'id="node-s-count"' in html and 'id="node-s-report"' in html and 'class="edge"' in html
    assert 'id="gantt"' in html and 'id="ckpt-timeline"' in html and "#1" in html
    assert "acc2" in html  # the selected step's output (report ran last)
    assert "every step succeeded" in html
    assert buttons(html) == set()  # a viewer never gets buttons
    assert web.get("/runs/esc1?events=failures").text.count('class="ev-') == 0
    assert web.get("/runs/esc1?partial=1").text.lstrip().startswith("<div class=\"live-root\"")
    assert web.get("/pool").status_code == 200
    r = web.get("/runs/nope")
    assert r.status_code == 404 and "unknown run" in r.text
    assert web.get("/runs/..%2F..%2Fetc").status_code in (400, 404)
    assert web.get("/static/segue.css").headers["content-type"].startswith("text/css")
    assert web.get("/static/..%2Fviews.py").status_code == 404


def test_buttons_follow_role_and_priority_class(web: TestClient, tokens: dict[str, str], home: Home,
                                                _test_pool: Path) -> None:
    lc = LocalClient(home, pool=_test_pool, actor="cli")
    lc.prepare(COUNTER, {"n": 5}, run_id="held")  # PENDING, no controller: nothing moves
    lc.pause("held")  # paused before it started
    login(web, tokens["viewer"])
    assert buttons(web.get("/runs/held").text) == set()
    r = web.post("/api/runs/held/resume", headers=ORIGIN)
    assert r.status_code == 403 and "needs operator" in r.json()["error"]
    login(web, tokens["batchop"])  # an operator of batch runs only: this run is normal
    assert buttons(web.get("/runs/held").text) == set()
    login(web, tokens["op"])
    html = web.get("/runs/held").text
    assert buttons(html) == {"resume", "cancel"}  # pause exists, hidden while PAUSED
    assert 'data-action="pause"' in html
    r = web.post("/api/runs/held/cancel", headers=ORIGIN)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert buttons(web.get("/runs/held").text) == set()


def test_no_auth_serves_pages_without_a_login(home: Home, _test_pool: Path) -> None:
    with TestClient(create_app(home, pool=_test_pool, auth=False), base_url=BASE) as c:
        r = c.get("/login", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        page = c.get("/")
        assert page.status_code == 200 and "local · admin" in page.text and "log out" not in page.text


def test_interruptions_are_drawn_with_their_causes(web: TestClient, tokens: dict[str, str], segue: Segue,
                                                   tmp_path: Path) -> None:
    """Pause through the API (actor api:op), resume, SIGKILL the worker, finish: the run
    page names each gap's cause and which checkpoint each attempt restored."""
    gate = tmp_path / "release"
    proc = segue("run", COUNTER, "--run-id", "gaps", "-p", "n=40", "-p", "sleep=0.005", "-p", f"hold={gate}",
                 "--detach")
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: segue.step("gaps", "count")["last_checkpoint"], what="a first checkpoint")
    login(web, tokens["op"])
    assert web.post("/api/runs/gaps/pause", headers=ORIGIN).status_code == 200
    wait_for(lambda: segue.status("gaps")["state"] == "PAUSED", what="PAUSED")
    assert web.post("/api/runs/gaps/resume", headers=ORIGIN).status_code == 200
    step = wait_for(lambda: (s := segue.step("gaps", "count"))["attempts"] == 2 and s["pid"] and
                    s["last_checkpoint"] and s["epoch"] == 2 and s, what="attempt 2 running")
    first = segue.step("gaps", "count")["last_checkpoint"]["seq"]
    wait_for(lambda: segue.step("gaps", "count")["last_checkpoint"]["seq"] > first, what="attempt 2 commits")
    os.kill(step["pid"], signal.SIGKILL)
    wait_for(lambda: segue.step("gaps", "count")["attempts"] == 3, what="attempt 3")
    gate.touch()
    wait_for(lambda: segue.status("gaps")["state"] == "SUCCEEDED", what="SUCCEEDED")
    html = web.get("/runs/gaps?step=count").text
    # Who resumed: the API's resume leaves no event naming api:op yet (its detached
    # controller records the change as "controller"), so only the pause is pinned.
    assert "paused by api:op; resumed by " in html
    assert "killed by SIGKILL; backoff" in html
    assert html.count('class="box st-') >= 4  # three attempts of count, one of report
    assert "restored by attempt 2" in html and "restored by attempt 3" in html
    assert "mk-pause" in html and "mk-crash" in html and "mk-resume" in html
    # The DAG marks the step where the run stopped: twice (pause, SIGKILL), the last a crash.
    node = re.search(r'<g class="node st-SUCCEEDED" id="node-s-count">(.*?)</g>\s*</a>', html, re.S)
    assert node and '<g class="dag-mark gap-crash" data-kind="crash">' in node.group(1)
    assert "interrupted here 2 times; last: killed by SIGKILL" in node.group(1)
    report = re.search(r'id="node-s-report">(.*?)</g>\s*</a>', html, re.S)
    assert report and "dag-mark" not in report.group(1)  # never interrupted
    failures = web.get("/runs/gaps?events=failures").text
    assert "killed by SIGKILL" in failures and "pause requested" not in failures
    assert 'href="/runs/gaps?step=count&amp;attempt=3"' in html
    assert "attempt epoch 3 of count ended with exit code 0" in web.get("/runs/gaps?step=count&attempt=3").text


def test_preemption_names_the_run_that_preempted(web: TestClient, tokens: dict[str, str], segue: Segue,
                                                 tmp_path: Path) -> None:
    gpujob = str(FLOWS / "gpujob.py")
    assert segue("pool", "set", "--gpus", "1", "--cpus", "8").returncode == 0
    low_gate, hi_gate = tmp_path / "gate-low", tmp_path / "gate-hi"
    segue("run", gpujob, "--detach", "--run-id", "low", "--priority", "batch", "-p", "n=200",
          "-p", f"gate={low_gate}", check=True)
    wait_for(lambda: (s := segue.step("low", "work"))["state"] == "RUNNING" and (s["progress"]["done"] or 0) >= 30,
             120, "low to run")
    segue("run", gpujob, "--detach", "--run-id", "hi", "--priority", "urgent", "-p", "n=60",
          "-p", f"gate={hi_gate}", check=True)
    segue.wait_state("low", {"PAUSED"}, 120)
    wait_for(lambda: segue.step("hi", "work")["pid"], 120, "the urgent run to hold the device")
    login(web, tokens["viewer"])
    pool = web.get("/pool").text
    assert re.search(r'<tr class="held">.*?<a href="/runs/hi">hi</a> · work', pool, re.S)
    hi_gate.touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    low_gate.touch()
    segue.wait_state("low", {"SUCCEEDED"}, 120)
    html = web.get("/runs/low").text
    assert "preempted by run hi; resumed by " in html and "mk-preempt" in html
    assert re.search(r'<g class="dag-mark gap-preempt" data-kind="preempt"><title>interrupted here: '
                     r'preempted by run hi; resumed by ', html)
    timeline = web.get("/pool").text
    assert 'id="device-timeline"' in timeline and timeline.count('class="box st-') >= 3  # low, hi, low


def test_large_fanout_folds_and_unfolds() -> None:
    steps = [("prepare", "SUCCEEDED")] + [(f"shard_{i}", "RUNNING" if i < 3 else "PENDING") for i in range(40)]
    steps.append(("merge", "PENDING"))
    edges = [("prepare", f"shard_{i}") for i in range(40)] + [(f"shard_{i}", "merge") for i in range(40)]
    g = dag.build(steps, edges)
    assert [n.label for n in g.nodes] == ["prepare", "shard* ×40", "merge"]
    assert g.nodes[1].counts == {"RUNNING": 3, "PENDING": 37} and g.nodes[1].state == "RUNNING"
    assert len(g.edges) == 2 and g.has_edges
    assert len(dag.build(steps, edges, frozenset({"shard*"})).nodes) == 42
    # An interruption of any folded shard marks the folded node, naming the shard.
    dag.mark_interruptions(g, [("shard_7", "preempt", "preempted by run hi", 10.0),
                               ("shard_2", "crash", "killed by SIGKILL", 20.0)])
    assert g.nodes[1].mark == dag.Mark("crash", "shard_2: killed by SIGKILL", 2)
    assert g.nodes[0].mark is None and g.nodes[2].mark is None
    assert len(dag.build(steps, None).nodes) == 3 and not dag.build(steps, None).has_edges


def test_a_large_fanout_run_page_folds_its_shards(web: TestClient, tokens: dict[str, str], home: Home,
                                                  tmp_path: Path, _test_pool: Path) -> None:
    shards = [f"shard_{i}" for i in range(20)]
    src = ["from segue import Flow", "flow = Flow('fan')", "", "@flow.step()", "def prepare(ctx):", "    return 1"]
    for name in shards:
        src += ["", "@flow.step(after=[prepare])", f"def {name}(ctx):", "    return 1"]
    src += ["", f"@flow.step(after=[{', '.join(shards)}])", "def merge(ctx):", "    return 1", ""]
    flow = tmp_path / "fan.py"
    flow.write_text("\n".join(src))
    LocalClient(home, pool=_test_pool, actor="cli").prepare(str(flow), run_id="fan")  # PENDING: nothing runs
    login(web, tokens["viewer"])
    html = web.get("/runs/fan").text
    assert 'id="node-g-shard*"' in html and "shard* ×20" in html and 'id="node-s-shard_3"' not in html
    assert html.count('class="edge"') == 2  # prepare -> shards -> merge
    assert 'id="grp-shard*"' in html and html.count('class="steprow"') == 22  # every step, in the fold
    unfolded = web.get("/runs/fan?expand=shard*").text
    assert 'id="node-s-shard_3"' in unfolded and unfolded.count('class="edge"') == 40


def test_flow_edges_come_from_the_unchanged_file_only(tmp_path: Path) -> None:
    import hashlib

    src = Path(COUNTER).read_bytes()
    digest = hashlib.sha256(src).hexdigest()
    assert dag.flow_edges(COUNTER, digest, ["count", "report"]) == [("count", "report")]
    assert dag.flow_edges(COUNTER, "0" * 64, ["count", "report"]) is None  # changed since the run
    assert dag.flow_edges(str(tmp_path / "gone.py"), digest, ["count"]) is None


def _shm_dir() -> Path:
    """A RAM-backed directory when there is one: 10k fsynced inserts take ~35 s on
    a disk and ~8 s in /dev/shm, and the page reads the same SQLite file either way."""
    base = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="segue-ui-10k-", dir=base if base.is_dir() else None))


def test_runs_page_with_10k_runs(_test_pool: Path) -> None:
    root = _shm_dir()
    try:
        home = Home.resolve(root / "home")
        home.ensure()
        store = home.open_store()
        t0 = time.perf_counter()
        for i in range(10_000):
            store.create_run(NewRun(run_id=f"r{i:05d}", flow_name=f"flow{i % 7}", flow_path="/nowhere/flow.py",
                                    params={"i": i}, fingerprint={"file": "0", "steps": {"a": "0", "b": "0"}},
                                    options={"priority": 100}), ["a", "b"], actor="test")
        created = time.perf_counter() - t0
        token = TokenStore(home).create("viewer", Role.VIEWER)
        with TestClient(create_app(home, pool=_test_pool), base_url=BASE) as c:
            c.cookies.set("segue_token", token)
            c.get("/?page=2")  # warm: imports, templates, the SQLite page cache
            timings = {}
            for url in ("/", "/?page=100", "/?state=PENDING&flow=flow3&page=5"):
                t0 = time.perf_counter()
                r = c.get(url)
                timings[url] = time.perf_counter() - t0
                assert r.status_code == 200
            page = c.get("/?page=100").text
        print(f"\n10k runs: created in {created:.1f}s; runs page: "
              + ", ".join(f"{u} {t * 1000:.0f} ms" for u, t in timings.items()))
        assert len(re.findall(r'<td><a href="/runs/r\d+">', page)) == 50
        assert "page 100 of 200" in page and "10,000" in page
        assert 'href="/runs/r05049"' in page  # newest first: page 100 holds r05049..r05000
        # The < 1 s target is a figure of `python -m benchmarks.server` (runs_page_10k_s), not
        # a bound here: a wall-clock bound fails on a loaded machine.
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_pool_page_lists_every_sharer_of_a_device(web: TestClient, tokens: dict[str, str], home: Home,
                                                  _test_pool: Path) -> None:
    from segue.hostname import this_host
    from segue.placement.policy import Need
    from segue.store.pool import Allocated
    from segue.store.pools import open_pool

    # The pool is set as its admin sets it (PUT /api/pool), and the host named as the
    # server names it: the devices below are those the page reads.
    r = web.put("/api/pool", json={"gpus": 1, "gpu_memory": "96GiB", "cpus": 8},
                headers={**ORIGIN, "Authorization": f"Bearer {tokens['admin']}"})
    assert r.status_code == 200, r.text
    host = r.json()["host"]
    pool = open_pool(_test_pool)
    for i, run in enumerate(("embed-a", "embed-b")):
        a = pool.allocate(str(home.root), run, "embed", host=host, need=Need(gpus=1, gpu_memory=40 * 2**30),
                          priority=0, preemptible=True, ttl_s=600)
        assert isinstance(a, Allocated) and pool.bind(a.id, i + 1, 600), (a, pool.get_host(host))
    login(web, tokens["viewer"])
    page = web.get("/pool").text
    row = re.search(r'<tr class="held">.*?</tr>', page, re.S)
    assert row is not None, (  # what it showed instead, and who names the host how
        f"this_host()={this_host()!r}, the API's host {host!r}, pool file hosts "
        f"{[(h.host, len(h.devices)) for h in pool.list_hosts()]}, allocations {pool.list_allocations()}: "
        + re.sub(r"\s+", " ", page[page.find("<main"):])[:2000])
    assert '<a href="/runs/embed-a">embed-a</a> · embed' in row.group(0)
    assert '<a href="/runs/embed-b">embed-b</a> · embed' in row.group(0)
    assert "16.0 GiB free" in row.group(0) or "16 GiB free" in row.group(0), row.group(0)


def test_a_run_time_fan_out_and_a_skipped_branch_on_the_run_page(web: TestClient, tokens: dict[str, str],
                                                                  segue: Segue) -> None:
    proc = segue("run", str(FLOWS / "paths.py"), "--run-id", "paths", "-p", "n=7", "-p", "prefer=fast",
                 timeout=300)
    assert proc.returncode == 0, proc.stderr
    login(web, tokens["viewer"])
    html = web.get("/runs/paths").text
    # The fan-out's items are folded into its step: one row, its count, no row per item.
    assert 'id="step-score"' in html and 'id="step-score.3"' not in html
    assert re.search(r'id="step-score"(?:(?!</tr>).)*7 / 7 tasks', html, re.S)
    # The branch not taken, and the loop after it, are SKIPPED and greyed out in the DAG.
    for name in ("slow_path", "rescore"):
        assert f'<g class="node st-SKIPPED" id="node-s-{name}">' in html
        assert re.search(rf'id="step-{name}"(?:(?!</tr>).)*<span class="state st-SKIPPED">SKIPPED</span>', html, re.S)
    assert '<g class="node st-SUCCEEDED" id="node-s-fast_path">' in html
    # The fan-out's edge from its parent comes from over= (edges are read from the file).
    assert html.count('class="edge"') == 7
    # One of its tasks can be selected: its attempts, log and output.
    item = web.get("/runs/paths?step=score.3")
    assert item.status_code == 200 and "shard-003" in item.text
    assert web.get("/runs/paths?step=score.99").status_code == 404  # no such task
