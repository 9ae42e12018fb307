"""/metrics against a real home: real runs through the CLI, scraped through the app,
parsed with prometheus_client's own parser, and compared with what the store says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra (fastapi) is not installed")
pytest.importorskip("prometheus_client", reason="the server extra (prometheus_client) is not installed")

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from segue_helpers import FLOWS, Segue, wait_for  # noqa: E402
from server_helpers import serving  # noqa: E402

from segue.client.local import LocalClient  # noqa: E402
from segue.home import Home  # noqa: E402
from segue.server import create_app  # noqa: E402
from segue.server import metrics as _metrics  # noqa: E402, F401 - registers /metrics
from segue.server.auth import Role, TokenStore  # noqa: E402
from segue.states import Actor, RunState  # noqa: E402
from segue.store import NewRun  # noqa: E402

COUNTER = str(FLOWS / "counter.py")

MAP_FLOW = '''
from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("recs", params={"input": "", "out": ""})


def keep(record):
    if record.get("bad"):
        raise ValueError("bad record")
    return {"k": record["k"]}


@flow.map(source=lambda ctx: JsonlSource(ctx.params["input"]),
          sink=lambda ctx: JsonlSink(ctx.params["out"]), checkpoint_every="50ms")
def copy(record):
    return keep(record)
'''

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base: str, token: str) -> Samples:
    r = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for fam in text_string_to_metric_families(r.text):
        assert fam.name.startswith("segue_"), fam.name
        for s in fam.samples:
            assert "run_id" not in s.labels  # never a run id as a label
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples[(metric, frozenset(labels.items()))]


def _events(client: LocalClient, run: str) -> list[dict[str, Any]]:
    return [asdict(e) for e in client.events(run)]


@pytest.fixture
def home_with_runs(segue: Segue, tmp_path: Path) -> dict[str, Any]:
    """A SUCCEEDED counter run, a PAUSED one, a data run with a dead letter, a PENDING one.

    Driven in this process through the library (the CLI's own calls), to keep the
    test short: each `segue` process costs a second on a loaded machine.
    """
    assert segue("pool", "set", "--gpus", "2", "--gpu-mem", "80GB", "--cpus", "8").returncode == 0
    client = LocalClient(segue.home)
    client.prepare(COUNTER, {"n": 80, "sleep": 0.004}, run_id="ok")
    assert client.drive("ok", reason="started").value == "SUCCEEDED"
    gate = tmp_path / "gate"
    client.submit(COUNTER, {"n": 40, "sleep": 0, "hold": str(gate)}, run_id="held")  # detached
    wait_for(lambda: client.checkpoints("held"), 60, "the held run to checkpoint", poll=0.1)
    assert client.pause("held", wait=True, timeout=60).state.value == "PAUSED"
    flow = tmp_path / "recs.py"
    flow.write_text(MAP_FLOW)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"k": i, **({"bad": True} if i == 7 else {})}) + "\n"
                           for i in range(300)))
    client.prepare(str(flow), {"input": str(inp), "out": str(tmp_path / "out")}, run_id="data")
    assert client.drive("data", reason="started").value == "SUCCEEDED"
    client.prepare(COUNTER, {"n": 5}, run_id="idle")  # PENDING: created, never started
    token = TokenStore(Home.resolve(segue.home)).create("prom", Role.VIEWER)
    return {"token": token, "client": client}


def test_metrics_match_the_store(segue: Segue, home_with_runs: dict[str, Any], _test_pool: Path) -> None:
    token, client = home_with_runs["token"], home_with_runs["client"]
    app = create_app(Home.resolve(segue.home), pool=_test_pool)
    with serving(app) as base:
        assert httpx.get(f"{base}/metrics").status_code == 401  # a viewer token is required
        m = scrape(base, token)

        # runs by state: what `segue ls` says
        by_state: dict[str, int] = {}
        for r in client.runs():
            by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
        assert by_state == {"SUCCEEDED": 2, "PAUSED": 1, "PENDING": 1}
        for state in ("PENDING", "RUNNING", "PAUSING", "PAUSED", "SUCCEEDED", "FAILED", "CANCELLED"):
            assert val(m, "segue_runs", state=state) == by_state.get(state, 0)

        # checkpoints: what `segue checkpoints --json` lists (committed ones, and the
        # ones retention pruned since)
        cks = segue.json("checkpoints", "ok") + [  # the CLI's list; the library's is the same
            asdict(c) for r in ("held", "data") for c in client.checkpoints(r)]
        assert cks and any(c["status"] == "pruned" for c in cks)
        assert val(m, "segue_checkpoints_total", outcome="committed") == len(cks)
        assert val(m, "segue_checkpoints_total", outcome="pruned") == sum(
            c["status"] == "pruned" for c in cks)
        assert val(m, "segue_checkpoints_total", outcome="quarantined") == 0
        assert val(m, "segue_checkpoint_size_bytes_count") == len(cks)
        assert val(m, "segue_checkpoint_size_bytes_sum") == sum(c["nbytes"] for c in cks)
        assert val(m, "segue_checkpoint_size_bytes_bucket", le="+Inf") == len(cks)
        assert val(m, "segue_checkpoint_live_bytes", status="committed") == sum(
            c["nbytes"] for c in cks if c["status"] == "committed")
        # every commit recorded how long its save took
        assert val(m, "segue_checkpoint_duration_seconds_count") == len(cks)
        commits = [e for r in ("ok", "held", "data") for e in _events(client, r)
                   if e["kind"] == "checkpoint" and e["to_state"] is None]
        assert len(commits) == len(cks)
        assert val(m, "segue_checkpoint_duration_seconds_sum") == pytest.approx(
            sum(e["data"]["duration_s"] for e in commits))

        # attempts: one per step of the finished runs, plus the held run's parked one
        steps = [s for r in ("ok", "held", "data") for s in client.status(r).to_json()["steps"]]
        assert val(m, "segue_step_attempts_started_total") == sum(s["attempts"] for s in steps)
        assert val(m, "segue_step_attempts_total", outcome="succeeded") == sum(
            s["state"] == "SUCCEEDED" for s in steps)
        assert val(m, "segue_step_attempts_total", outcome="parked") == 1
        assert val(m, "segue_step_attempts_total", outcome="failed") == 0

        # pause latency: the held run's PAUSING -> PAUSED, from its events
        ev = [e for e in _events(client, "held") if e["kind"] == "run"]
        pausing = next(e["time"] for e in ev if e["to_state"] == "PAUSING")
        paused = next(e["time"] for e in ev if e["to_state"] == "PAUSED")
        assert val(m, "segue_pause_latency_seconds_count") == 1
        assert val(m, "segue_pause_latency_seconds_sum") == pytest.approx(paused - pausing)
        assert val(m, "segue_preemptions_total") == 0

        # records: the data step read 300, wrote 299, dead-lettered one
        assert val(m, "segue_records_processed_total") == 300
        assert val(m, "segue_records_written_total") == 299
        assert val(m, "segue_records_dead_lettered_total") == 1

        # devices: the machine's pool (two virtual GPUs, both free now)
        assert val(m, "segue_pool_devices", state="free") == 2
        assert val(m, "segue_pool_devices", state="allocated") == 0
        assert val(m, "segue_pool_device_allocated", device="0", name="virtual-0") == 0
        assert val(m, "segue_pool_device_allocated", device="1", name="virtual-1") == 0
        assert val(m, "segue_pool_cpus") == 8

        # a later scrape reads only the new events, and counts them
        client.cancel("idle")
        m2 = scrape(base, token)
        assert val(m2, "segue_runs", state="PENDING") == 0
        assert val(m2, "segue_runs", state="CANCELLED") == 1
        assert val(m2, "segue_checkpoints_total", outcome="committed") == len(cks)

    # counters are a function of the event log: a new server reports the same totals
    with serving(create_app(Home.resolve(segue.home), pool=_test_pool)) as base:
        m3 = scrape(base, token)
    counters = {k: v for k, v in m2.items() if k[0].endswith(("_total", "_sum", "_count", "_bucket"))}
    assert counters == {k: m3[k] for k in counters}


def test_metrics_of_a_fresh_home_are_zero_and_create_nothing(tmp_path: Path, _test_pool: Path) -> None:
    home = Home.resolve(tmp_path / "fresh")
    home.ensure()
    token = TokenStore(home).create("prom", Role.VIEWER)
    (home.root / "segue.db").unlink()  # a home whose store was never opened
    app = create_app(home, pool=_test_pool)
    with serving(app) as base:
        m = scrape(base, token)
    assert val(m, "segue_runs", state="RUNNING") == 0
    assert val(m, "segue_checkpoints_total", outcome="committed") == 0
    assert not (home.root / "segue.db").exists()


def test_metrics_refuse_a_token_in_the_url_and_can_be_public(tmp_path: Path, _test_pool: Path) -> None:
    home = Home.resolve(tmp_path / "h")
    home.open_store().close()
    token = TokenStore(home).create("prom", Role.VIEWER)
    app = create_app(home, pool=_test_pool)
    with serving(app) as base:
        assert httpx.get(f"{base}/metrics?token={token}").status_code == 401
        assert httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer sgt_wrong"}
                         ).status_code == 401
        app.state.metrics_public = True  # an operator's explicit choice (e.g. a scrape-only network)
        assert httpx.get(f"{base}/metrics").status_code == 200


# -- a home whose store is PostgreSQL ------------------------------------------------------
@pytest.fixture
def pg_home(pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Home]:
    url = pg.create_database()
    monkeypatch.setenv("SEGUE_STORE", url)
    try:
        yield Home.resolve(tmp_path / "pg-home")
    finally:
        pg.drop_database(url)


def test_metrics_on_a_postgres_home(pg_home: Home, _test_pool: Path) -> None:
    """The counters page the event log by commit position there (events of every run
    interleave across transactions); the figures are the store's."""
    store = pg_home.open_store()
    try:
        store.create_run(NewRun("r1", "f", "/f.py", {}, {}), ["s"], actor=Actor.CLI)
        store.create_run(NewRun("idle", "f", "/f.py", {}, {}), ["s"], actor=Actor.CLI)
        store.transition_run("r1", RunState.RUNNING, actor=Actor.CLI, reason="go")
        epoch = store.start_attempt("r1", "s", ttl_s=60, actor=Actor.CONTROLLER).epoch
        store.commit_checkpoint("r1", "s", epoch, seq=1, path="p", nbytes=1000, duration_s=0.5,
                                position={"records_in": 10, "records_out": 9, "failures": 1})
        store.complete_task("r1", "s", epoch, output_ref=None, actor=Actor.WORKER)
        token = TokenStore(pg_home).create("prom", Role.VIEWER)
        with serving(create_app(pg_home, pool=_test_pool)) as base:
            m = scrape(base, token)
            assert val(m, "segue_runs", state="RUNNING") == 1
            assert val(m, "segue_runs", state="PENDING") == 1
            assert val(m, "segue_step_attempts_started_total") == 1
            assert val(m, "segue_step_attempts_total", outcome="succeeded") == 1
            assert val(m, "segue_checkpoints_total", outcome="committed") == 1
            assert val(m, "segue_checkpoint_size_bytes_sum") == 1000
            assert val(m, "segue_checkpoint_duration_seconds_sum") == 0.5
            assert val(m, "segue_checkpoint_live_bytes", status="committed") == 1000
            assert val(m, "segue_records_processed_total") == 10
            assert val(m, "segue_records_written_total") == 9
            assert val(m, "segue_records_dead_lettered_total") == 1
            # a later scrape counts what was written since, once
            store.transition_run("r1", RunState.PAUSING, actor=Actor.SCHEDULER, reason="preempted")
            store.transition_run("r1", RunState.PAUSED, actor=Actor.CONTROLLER, reason="paused")
            m2 = scrape(base, token)
            assert val(m2, "segue_preemptions_total") == 1
            assert val(m2, "segue_pause_latency_seconds_count") == 1
            assert val(m2, "segue_runs", state="PAUSED") == 1
            assert val(m2, "segue_step_attempts_started_total") == 1
        with serving(create_app(pg_home, pool=_test_pool)) as base:  # a new server: same totals
            m3 = scrape(base, token)
        counters = {k: v for k, v in m2.items() if k[0].endswith(("_total", "_sum", "_count", "_bucket"))}
        assert counters == {k: m3[k] for k in counters}
    finally:
        store.close()
