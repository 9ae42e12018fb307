"""The client contract, run against a home (LocalClient) and a real `segue server` (HttpClient).

Each test drives real controllers and workers; the two kinds of client must
return equal records and raise the same error classes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue

import segue
from segue import RunState
from segue.client.base import BaseClient

COUNTER = str(FLOWS / "counter.py")


def _until(cond: Any, what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_submit_wait_output_and_records(client: BaseClient, counter_ref: Any) -> None:
    run = client.submit(COUNTER, {"n": 40, "sleep": "0.01"}, run_id="c1")
    assert run.run_id == "c1" and run.flow == "counter" and run.state != RunState.PENDING
    done = client.wait("c1", [RunState.SUCCEEDED, RunState.FAILED], timeout=120)
    assert done.state == RunState.SUCCEEDED
    assert client.output("c1", "report") == counter_ref(40)["report"]
    st = client.status("c1")
    assert st.state == RunState.SUCCEEDED and [s.name for s in st.steps] == ["count", "report"]
    assert st.step("count").state == "SUCCEEDED" and st.step("count").last_checkpoint is not None
    assert st.params["n"] == 40
    cks = client.checkpoints("c1")
    assert cks and all(c.run_id == "c1" for c in cks)
    events = list(client.events("c1"))
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert [e.to_state for e in events if e.kind == "run"][-1] == "SUCCEEDED"
    later = list(client.events("c1", after=events[len(events) // 2].id))
    assert later == events[len(events) // 2 + 1:]
    logs = "".join(client.logs("c1", "count"))
    assert "==> count attempt 1" in logs
    assert [r.run_id for r in client.runs(state="SUCCEEDED")] == ["c1"]
    assert client.runs(state=["FAILED", "PAUSED"]) == []
    assert [r.run_id for r in client.runs(flow="counter")] == ["c1"]
    assert client.runs(flow="other") == []


def test_pause_wait_resume_and_follow(client: BaseClient, tmp_path: Path, counter_ref: Any) -> None:
    gate = tmp_path / "gate"
    client.submit(COUNTER, {"n": 30, "sleep": "0", "hold": str(gate)}, run_id="p1")
    # The last iteration is held: wait until the attempt checkpointed while held.
    _until(lambda: client.status("p1").step("count").last_checkpoint, "a checkpoint")
    paused = client.pause("p1", wait=True, timeout=60)
    assert paused.state == RunState.PAUSED
    who = [e.actor for e in client.events("p1") if e.to_state == "PAUSING"]
    assert who and who[0].startswith("api")  # the request names its principal
    resumed = client.resume("p1")
    assert resumed.state == RunState.RUNNING  # returned once its controller took it
    gate.touch()
    seen = [e.to_state for e in client.events("p1", follow=True)]
    assert "SUCCEEDED" in seen  # follow ends once the run rests, after its last event
    assert client.status("p1").state == RunState.SUCCEEDED
    assert client.output("p1", "report") == counter_ref(30)["report"]
    with pytest.raises(segue.UsageError, match="SUCCEEDED"):
        client.resume("p1")


def test_unknown_runs_and_bad_input_write_nothing(client: BaseClient) -> None:
    client.submit(COUNTER, {"n": 5, "sleep": "0"}, run_id="ok")
    client.wait("ok", timeout=120)
    # The controller releases its lease (a write) after the run ends: wait for it.
    _until(lambda: client.status("ok").controller["lease_until"] is None, "the controller to let go")
    before = client.runs()
    for call in (lambda: client.status("nope"), lambda: client.pause("nope"),
                 lambda: client.resume("nope"), lambda: client.cancel("nope"),
                 lambda: list(client.events("nope")), lambda: client.checkpoints("nope"),
                 lambda: client.output("nope", "count"), lambda: list(client.logs("nope"))):
        with pytest.raises(segue.UnknownRunError, match=r"^unknown run 'nope'"):
            call()
    with pytest.raises(segue.ParamError):
        client.submit(COUNTER, {"nonexistent": 1})
    with pytest.raises(segue.ParamError):
        client.submit(COUNTER, {"n": "many"})
    with pytest.raises(segue.FlowError):
        client.submit("/no/such/flow.py")
    with pytest.raises(segue.UsageError, match="exists"):
        client.submit(COUNTER, {"n": 5}, run_id="ok")
    with pytest.raises(segue.UsageError):
        client.submit(COUNTER, {"n": 5}, priority="superurgent")
    assert client.runs() == before


def test_wait_times_out_and_cancel(client: BaseClient, tmp_path: Path) -> None:
    client.submit(COUNTER, {"n": 10, "sleep": "0", "hold": str(tmp_path / "never")}, run_id="w1")
    with pytest.raises(segue.WaitTimeoutError, match="still"):
        client.wait("w1", ["SUCCEEDED"], timeout=0.5)
    assert client.cancel("w1").state == RunState.CANCELLED
    assert client.wait("w1", ["CANCELLED"], timeout=5).state == RunState.CANCELLED


def test_pool_and_queue(client: BaseClient) -> None:
    view = client.pool()
    assert view.host and view.cpus > 0 and isinstance(view.devices, list)
    assert client.queue() == []


def test_pool_changes_name_who_made_them(client: BaseClient, tmp_path: Path) -> None:
    assert client.pool_changes() == []
    cli = Segue(tmp_path / "home")  # the CLI on the client's home and pool ($SEGUE_POOL)
    for gpus in (2, 3):
        proc = cli("pool", "set", "--gpus", str(gpus), "--gpu-mem", "24GiB")
        assert proc.returncode == 0, proc.stderr
    latest, first = client.pool_changes()  # newest first
    assert (latest.actor, first.actor) == ("cli", "cli")
    assert latest.id > first.id and latest.time >= first.time and latest.host == client.pool().host
    assert (latest.change["before"]["gpus"], latest.change["after"]["gpus"]) == (2, 3)
    assert latest.change["after"]["gpu_memory"] == [24 * 2**30]
    assert client.pool_changes(limit=1) == [latest] and client.pool_changes(limit=0) == []
    for bad in (-1, 1001):
        with pytest.raises(segue.UsageError, match="limit must be"):
            client.pool_changes(limit=bad)


def test_configure_pool_with_types_and_groups(client: BaseClient) -> None:
    view = client.configure_pool(gpus=1, gpu_memory="96GiB", cpus=4, gpu_type="rtx-pro-6000",
                                 groups=[(2, "24GiB", "l4")])
    assert [d.memory for d in view.devices] == [96 * 2**30, 24 * 2**30, 24 * 2**30]
    assert [d.index for d in view.devices] == [0, 1, 2]
    assert len({d.name for d in view.devices}) == 2  # the two types are told apart
    change = client.pool_changes(limit=1)[0]
    assert change.actor != "" and change.change["after"]["gpus"] == 3
    with pytest.raises(segue.UsageError):
        client.configure_pool(gpus=-1)
    assert client.pool_changes(limit=1) == [change]  # a refused change writes nothing


def test_both_kinds_return_equal_records(tmp_path: Path, _test_pool: Path, server: Any) -> None:
    local = segue.Client(server.home, pool=_test_pool)
    with segue.Client(server.url, token=server.token) as remote:
        local.submit(COUNTER, {"n": 10, "sleep": "0"}, run_id="eq")
        local.wait("eq", timeout=120)
        # One comparison of the whole document; the only figure that moves with the
        # clock between two reads (storage accrued so far) is left out of both.
        assert _steady(remote.status("eq")) == _steady(local.status("eq"))
        assert remote.runs() == local.runs()
        assert list(remote.events("eq")) == list(local.events("eq"))
        assert remote.checkpoints("eq") == local.checkpoints("eq")
        assert remote.output("eq", "report") == local.output("eq", "report")
        local.configure_pool(gpus=1)
        assert remote.pool_changes() == local.pool_changes() != []


def _steady(st: Any) -> dict[str, Any]:
    doc = st.to_json()
    doc["accounting"]["cost"].pop("storage_so_far")
    return doc


def test_client_factory_refuses_mixed_arguments(tmp_path: Path) -> None:
    with pytest.raises(segue.UsageError, match="token="):
        segue.Client(tmp_path, token="x")
    with pytest.raises(segue.UsageError, match="pool="):
        segue.Client("http://127.0.0.1:1", pool=tmp_path / "p.db")
    # A home that does not exist is not created by reading it.
    c = segue.Client(tmp_path / "nohome")
    assert c.runs() == []
    with pytest.raises(segue.UsageError, match="no segue home"):
        c.status("x")
    assert not (tmp_path / "nohome").exists()
