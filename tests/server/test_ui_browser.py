"""The web UI in a real browser: Debian's chromium, driven by Playwright, against a
real `segue server` process over a real home with a real run.

An operator logs in, watches the run's progress move, pauses it with the
button (PAUSED on the page and in the store), resumes it and sees it finish;
a viewer sees no buttons and the API refuses its pause. On a one-GPU pool, a
batch run preempted by an urgent one resumes by itself, and its page names
the run that preempted it. Screenshots of the run pages and the pool page go
under the test's tmp dir (and into docs/screenshots/ with
SEGUE_UPDATE_SCREENSHOTS=1). Every wait is on observed state (the page's DOM
or the store), not a sleep.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from segue_helpers import FLOWS, Segue, flow_module, wait_for  # noqa: E402
from serverkit import ServerProcess  # noqa: E402

from segue.home import Home  # noqa: E402
from segue.server.auth import Role, TokenStore  # noqa: E402

COUNTER = str(FLOWS / "counter.py")
GPUJOB = str(FLOWS / "gpujob.py")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
TIMEOUT_MS = 90_000  # a loaded 2-core machine runs chromium, the server, a controller and a worker


def _chromium() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed: `apt-get install -y chromium` "
                             "(make install-dev does it as root); the browser test needs it")


@pytest.fixture
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        # Chromium's sandbox refuses to run as root (containers, CI).
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield b
        finally:
            b.close()


def _login(browser: Any, url: str, token: str, path: str) -> Any:
    page = browser.new_context(viewport={"width": 1300, "height": 900}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url + path)
    assert "/login" in page.url  # no cookie yet: the form, and the token goes in a POST body
    page.fill("#token", token)
    page.click("form[action='/login'] button[type=submit]")
    page.wait_for_url(url + path)
    assert token not in page.url
    return page


def _progress(page: Any) -> float:
    text = page.text_content("#step-count .progress-text") or ""
    head = text.strip().split(" ")[0].replace(",", "")
    try:
        return float(head)
    except ValueError:
        return -1.0


def _shoot(page: Any, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    page.screenshot(path=str(out), full_page=True)
    if os.environ.get("SEGUE_UPDATE_SCREENSHOTS"):  # the docs' copies change only on request
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, SCREENSHOTS / name)
    return out


def test_operator_pauses_and_resumes_in_the_browser(browser: Any, tmp_path: Path, _test_pool: Path) -> None:
    home = tmp_path / "home"
    with ServerProcess(home=home, pool=_test_pool, logs=tmp_path) as srv:
        segue = Segue(home)
        ts = TokenStore(Home.resolve(home))
        op, viewer = ts.create("op", Role.OPERATOR), ts.create("viewer", Role.VIEWER)
        assert segue("pool", "set", "--gpus", "2").returncode == 0
        gate = tmp_path / "release"  # the last iteration waits for it: the pause lands before the end
        proc = segue("run", COUNTER, "--run-id", "web1", "-p", "n=1000", "-p", "sleep=0.01",
                     "-p", f"hold={gate}", "--gpus", "1", "--detach")
        assert proc.returncode == 0, proc.stderr

        page = _login(browser, srv.url, op, "/runs/web1")
        # Progress moves on the page by itself (the page script refreshes it).
        page.wait_for_function("() => { const e = document.querySelector('#step-count .progress-text');"
                               " return e && parseFloat(e.textContent.replace(/,/g, '')) > 0; }")
        first = _progress(page)
        page.wait_for_function("v => parseFloat(document.querySelector('#step-count .progress-text')"
                               ".textContent.replace(/,/g, '')) > v", arg=first)
        assert _progress(page) > first > 0

        page.click("button[data-action=pause]")
        t0 = time.monotonic()
        page.wait_for_selector('#run-state[data-state="PAUSED"]')
        shown_after = time.monotonic() - t0
        assert segue.status("web1")["state"] == "PAUSED"
        actors = [e["actor"] for e in segue.events("web1") if e["to_state"] == "PAUSING"]
        assert actors == ["api:op"]
        print(f"\npause click -> PAUSED shown in the page: {shown_after:.2f}s")
        assert page.is_hidden("button[data-action=pause]") and page.is_visible("button[data-action=resume]")

        page.click("button[data-action=resume]")
        page.wait_for_selector('#run-state[data-state="RUNNING"]')
        wait_for(lambda: (s := segue.step("web1", "count"))["attempts"] == 2 and s["state"] == "RUNNING",
                 timeout=120, what="attempt 2 running")

        pool = page.context.new_page()
        pool.set_default_timeout(TIMEOUT_MS)
        pool.goto(srv.url + "/pool")
        pool.wait_for_selector("table.devices tr.held")  # the run holds one virtual GPU
        assert "web1" in (pool.text_content("table.devices") or "")
        _shoot(pool, tmp_path, "pool-page.png")

        gate.touch()
        page.wait_for_selector('#run-state[data-state="SUCCEEDED"]', timeout=180_000)
        assert segue.status("web1")["state"] == "SUCCEEDED"
        assert page.is_visible("#gantt") and page.is_visible("#ckpt-timeline")
        assert "paused by api:op" in (page.text_content("table.gaps") or "")
        shot = _shoot(page, tmp_path, "run-page.png")
        assert shot.stat().st_size > 10_000

        # A viewer sees the same run without buttons, and the API refuses its pause.
        vpage = _login(browser, srv.url, viewer, "/runs/web1")
        assert vpage.locator("button[data-action]").count() == 0
        status = vpage.evaluate("() => fetch('/api/runs/web1/pause', {method: 'POST', credentials: "
                                "'same-origin', headers: {'Content-Type': 'application/json'}, body: '{}'})"
                                ".then(r => r.status)")
        assert status == 403


def _expected_acc(n: int) -> float:
    return float(flow_module("gpujob").expected_acc(n))


def test_preempted_run_resumes_by_itself_and_its_page_names_the_preemptor(
        browser: Any, tmp_path: Path, _test_pool: Path) -> None:
    home = tmp_path / "home"
    with ServerProcess(home=home, pool=_test_pool, logs=tmp_path) as srv:
        segue = Segue(home)
        viewer = TokenStore(Home.resolve(home)).create("viewer", Role.VIEWER)
        assert segue("pool", "set", "--gpus", "1", "--cpus", "8").returncode == 0
        # Each run holds half-way until the test opens its gate: the test, not the
        # machine's speed, decides when a run may end.
        low_gate, hi_gate = tmp_path / "gate-low", tmp_path / "gate-hi"
        segue("run", GPUJOB, "--detach", "--run-id", "low", "--priority", "batch", "-p", "n=200",
              "-p", f"gate={low_gate}", check=True)
        wait_for(lambda: (s := segue.step("low", "work"))["state"] == "RUNNING"
                 and (s["progress"]["done"] or 0) >= 30, 120, "the batch run to hold the gpu and progress")
        # The urgent run has more work after its gate than the batch run has left: the
        # gap is a good part of the batch run's time line (room for its label).
        segue("run", GPUJOB, "--detach", "--run-id", "hi", "--priority", "urgent", "-p", "n=300",
              "-p", f"gate={hi_gate}", check=True)
        segue.wait_state("low", {"PAUSED"}, 120)
        wait_for(lambda: segue.step("hi", "work")["pid"], 120, "the urgent run to hold the gpu")

        page = _login(browser, srv.url, viewer, "/runs/low")
        page.wait_for_selector('#run-state[data-state="PAUSED"]')
        assert "preempted by run hi; waiting" in (page.text_content("table.gaps") or "")
        pool = page.context.new_page()
        pool.set_default_timeout(TIMEOUT_MS)
        pool.goto(srv.url + "/pool")
        assert re.search(r"\bhi · work", pool.text_content("table.devices tr.held") or "")  # the preemptor
        pool.close()

        hi_gate.touch()
        segue.wait_state("hi", {"SUCCEEDED"}, 180)
        # Nobody resumes it: the freed device wakes it, and its page follows by itself.
        wait_for(lambda: (s := segue.step("low", "work"))["attempts"] == 2 and s["state"] == "RUNNING",
                 180, "the batch run's second attempt")
        low_gate.touch()
        page.wait_for_selector('#run-state[data-state="SUCCEEDED"]', timeout=180_000)
        assert segue.status("low")["state"] == "SUCCEEDED"
        out = segue.output("low", "work")
        assert out["i"] == 200 and out["acc"] == _expected_acc(200)  # bit-exact across the preemption
        events = segue.events("low")
        assert not [e for e in events if e["kind"] == "command"]  # no one asked for the resume
        assert [(e["from_state"], e["actor"]) for e in events if e["kind"] == "run"
                and e["to_state"] == "RUNNING"] == [("PENDING", "controller"), ("PAUSED", "scheduler")]

        gaps = page.text_content("table.gaps") or ""
        m = re.search(r"preempted by run hi; resumed by (\S+)", gaps)
        assert m, gaps
        assert m.group(1) != "api:viewer"
        assert page.locator("#gantt g.box.gap-preempt").count() == 1
        label = page.text_content("#gantt g.box.gap-preempt text.gaplabel") or ""  # drawn, not only a tooltip
        assert label.startswith("preempted by run hi"), label
        assert page.locator("#gantt g.marker.mk-preempt").count() == 1
        # The DAG marks the step where the run stopped, with the cause on hover.
        mark = page.locator("svg.dag #node-s-work g.dag-mark.gap-preempt")
        assert mark.count() == 1
        assert (mark.locator("title").text_content() or "").startswith("interrupted here: preempted by run hi")
        assert page.locator("#ckpt-timeline circle.ck-restored").count() >= 1  # what attempt 2 restored
        page.click("#interruptions summary")
        marks = page.text_content("#interruptions") or ""
        assert "preempted by run hi" in marks and f"resumed by {m.group(1)}" in marks
        shot = _shoot(page, tmp_path, "run-page-preempted.png")
        assert shot.stat().st_size > 10_000
