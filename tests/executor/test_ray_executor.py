"""The Ray executor on a real Ray cluster, driven through the CLI.

A head (no CPUs: attempts never land on it) and three worker nodes of one CPU
and one (logical) GPU each on this machine (``ray.cluster_utils.Cluster``), so
a data step's two sub-workers and a gang's two ranks are always on two nodes,
with node health checks shortened so
that a removed node is declared dead in well under a second. A node is lost
with ``remove_node(..., allow_graceful=False)``: its raylet and every process
on it die at once, as when a machine goes away. Every fault is gated on
observed progress (a committed checkpoint of the attempt on that node) and
counted: the node that ran the attempt is named in its log, the store records
the lost attempt, and the next attempt ran on another node.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import gangkit
import pytest
import raykit
from raykit import MiB, on_ray, start_cluster
from segue_helpers import FLOWS, Segue, wait_for

ray = pytest.importorskip("ray", reason="the Ray executor tests need Ray: pip install 'segue[ray]'")

from segue.home import Home  # noqa: E402

QUICK = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
NODE = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 80 * MiB}
# Node losses with random timing: the issue asks for ten; CI runs them all.
REPS = int(os.environ.get("SEGUE_RAY_NODE_LOSS_REPS", "10"))


@pytest.fixture(scope="module")
def cluster() -> Any:
    c = start_cluster(ray, [NODE] * 3)
    yield c
    ray.shutdown()
    c.shutdown()


def explain(segue: Segue, run: str, pred: Any, timeout: float, what: str) -> Any:
    return raykit.explain(ray, segue, run, pred, timeout, what)


def node_of(segue: Segue, run: str, step: str, epoch: int) -> str:
    """The Ray node an attempt ran on, as its log (streamed home) says."""
    log = segue.home / "logs" / run / f"{step}.e{epoch}.log"

    def named() -> str | None:
        m = re.search(r"on Ray node ([0-9a-f]+)", log.read_text()) if log.exists() else None
        return m.group(1) if m else None

    return wait_for(named, 60, f"the log of {step} epoch {epoch} to name its Ray node")


def members_of(segue: Segue, run: str, step: str, epoch: int, noun: str, n: int) -> dict[int, str]:
    """The Ray node of each member (sub-worker or rank) of an attempt, as its log says."""
    log = segue.home / "logs" / run / f"{step}.e{epoch}.log"

    def named() -> dict[int, str] | None:
        text = log.read_text() if log.exists() else ""
        found = {int(i): node for i, node in re.findall(rf"{noun} (\d+) runs on Ray node ([0-9a-f]+)", text)}
        return found if len(found) == n else None

    return wait_for(named, 60, f"the log of {step} epoch {epoch} to name its {n} {noun}s' nodes")


def lose_node(cluster: Any, node_id: str) -> None:
    """Remove the node at once (no graceful drain), then add a fresh one in its place."""
    victim = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    cluster.remove_node(victim, allow_graceful=False)
    cluster.add_node(**NODE)


def same_counter(segue: Segue, run: str, ref: dict[str, Any]) -> None:
    """The counter's outputs equal the reference's, bit for bit."""
    import numpy as np

    got = segue.output(run, "count")
    assert got["i"] == ref["count"]["i"] and got["acc"] == ref["count"]["acc"], (run, got)
    np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
    assert segue.output(run, "report") == ref["report"]


def failures(segue: Segue, run: str) -> list[str]:
    """Why each failed attempt failed, in order (the failure detector's transitions)."""
    return [e["reason"] for e in segue.events(run)
            if e["actor"] == "failure-detector" and e["kind"] == "task"]


# How the controller learns that an attempt was lost with its node: Ray reports its
# actor dead, or (a loaded machine, where Ray's notice is slower) its lease lapses first.
LOST = ("the Ray actor of this attempt died", "stopped heartbeating (lease expired)")


def lost_attempts(segue: Segue, run: str) -> list[str]:
    """The store's record of attempts lost with their node (one failure each)."""
    return [f for f in failures(segue, run) if any(w in f for w in LOST)]


def store_of(segue: Segue) -> Any:
    return Home.resolve(segue.home).open_store()


def committed(store: Any, run: str, step: str, epoch: int, at_least: int = 1) -> bool:
    return sum(c.epoch == epoch for c in store.list_checkpoints(run, step)) >= at_least


def test_a_flow_runs_unchanged_on_ray_and_ends_as_it_does_locally(
        segue: Segue, cluster: Any, counter_ref: Any) -> None:
    proc = segue("run", str(FLOWS / "counter.py"), "--run-id", "r", "-p", "n=120", *on_ray(cluster))
    assert proc.returncode == 0, proc.stderr
    same_counter(segue, "r", counter_ref(120))
    # Each attempt ran in an actor on a worker node; its output came home to `segue logs`.
    workers = {n.node_id for n in cluster.worker_nodes}
    assert node_of(segue, "r", "count", 1) in workers, (workers, ray.nodes(), cluster.head_node.node_id)
    logs = segue("logs", "r").stdout
    assert "attempt epoch 1 of count ended with exit code 0" in logs, logs
    assert segue.status("r")["state"] == "SUCCEEDED"


# More of the integration suite's flows (the counter above, the data step, the gangs and
# the elastic step have tests of their own below), each run from the same file with the
# same parameters locally and on Ray: a step that fails once and is retried, with its
# traceback and prints in `segue logs`; a step whose result depends on torch's RNG.
UNCHANGED = [("chatty.py", ("-p", "bad=false"), {"talk": 2, "gate": 1, "bad": 1}),
             ("torchrng.py", ("-p", "n=60", "-p", "sleep=0"), {"draw": 1})]


@pytest.mark.parametrize(("name", "params", "attempts"), UNCHANGED, ids=[u[0] for u in UNCHANGED])
def test_integration_flows_run_unchanged_on_ray_with_the_same_attempts_and_outputs(
        segue: Segue, cluster: Any, tmp_path: Path, name: str, params: tuple[str, ...],
        attempts: dict[str, int]) -> None:
    if name == "torchrng.py":
        pytest.importorskip("torch", reason="torchrng.py needs torch: pip install torch")
    flow = str(FLOWS / name)
    local = Segue(tmp_path / "local")
    runs = {"local": local, "ray": segue}
    for where, s in runs.items():
        proc = s("run", flow, "--run-id", "u", *params, *(on_ray(cluster) if where == "ray" else ()),
                 env=QUICK, timeout=300)
        assert proc.returncode == 0, (where, proc.stdout[-2000:], proc.stderr)
        assert s.status("u")["state"] == "SUCCEEDED", where
        got = {st["name"]: (st["state"], st["attempts"]) for st in s.status("u")["steps"]}
        assert got == {step: ("SUCCEEDED", n) for step, n in attempts.items()}, (where, got)
    for step in attempts:  # as a user reads them: exactly equal (JSON floats round-trip)
        assert segue.json("output", "u", step) == local.json("output", "u", step), step
    # Every attempt ran on a worker node, and what it printed came home.
    workers = {n.node_id for n in cluster.worker_nodes}
    first = next(iter(attempts))
    assert node_of(segue, "u", first, 1) in workers
    if name == "chatty.py":
        logs = segue("logs", "u", "talk").stdout
        for line in ("hello from attempt 1", "ValueError: boom at attempt 1", "hello from attempt 2"):
            assert line in logs, logs


@pytest.mark.timeout(900)  # REPS node losses, each wait bounded on its own; 300 s ran out on a loaded box
def test_node_loss_mid_step_recovers_on_another_node_exactly_once(
        segue: Segue, cluster: Any, counter_ref: Any, tmp_path: Path) -> None:
    """REPS times, at a random checkpoint of the attempt, its node is removed at once."""
    seed = int(os.environ.get("SEGUE_TEST_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    ref = counter_ref(200)
    store = store_of(segue)
    landed = 0
    for i in range(REPS):
        run, gate = f"loss{i}", tmp_path / f"gate{i}"
        segue("run", str(FLOWS / "counter.py"), "--run-id", run, "--detach", "-p", "n=200",
              "-p", f"hold={gate}", *on_ray(cluster), env=QUICK, check=True)
        k = rng.randint(1, 4)
        explain(segue, run, lambda: committed(store, run, "count", 1, k), 120,
                f"{run}: checkpoint {k} of the first attempt (seed {seed})")
        time.sleep(rng.uniform(0, 0.2))
        lost = node_of(segue, run, "count", 1)
        lose_node(cluster, lost)
        # The next attempt restored and committed on a live node.
        explain(segue, run, lambda: committed(store, run, "count", 2), 120, f"{run}: a checkpoint of attempt 2")
        assert node_of(segue, run, "count", 2) != lost
        gate.touch()
        segue.wait_state(run, {"SUCCEEDED"}, 120)
        same_counter(segue, run, ref)
        assert len(lost_attempts(segue, run)) == 1, failures(segue, run)
        landed += 1
        # Completed steps are never re-run: the report step ran once, after the loss.
        assert store.get_task(run, "report").attempts == 1
    assert landed == REPS


def _kill_campaign() -> Any:
    """tests/data/test_kill_campaign.py, whose flow, input and checks the data tests here share."""
    import sys

    where = str(Path(__file__).parents[1] / "data")
    if where not in sys.path:  # once, however many tests ask
        sys.path.insert(0, where)
    import test_kill_campaign

    return test_kill_campaign


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "sqlite", "external"])
def test_every_sink_of_the_kill_campaign_flow_is_exactly_once_on_ray_across_worker_kills(
        segue: Segue, cluster: Any, tmp_path: Path, kind: str) -> None:
    """The data kill campaign's flow (tests/data/flows/mapflow.py), unchanged, on Ray: the
    attempt's worker is SIGKILLed right after its third checkpoint commit, in the first
    attempt and again in the second (its sink has parts staged under that commit that
    it has not published); the third ends, and the output equals a local uninterrupted
    run's, every record once."""
    if kind == "parquet":
        pytest.importorskip("pyarrow", reason="the parquet sink needs pyarrow")
    kc = _kill_campaign()
    n = 4000
    inp = kc.make_input(tmp_path / "in", n)
    # 2 s of sleeps at the least, so the first attempt is killed before a third of them
    # and the second still commits three checkpoints (every 100 ms) however fast the
    # machine; shards small enough to make many commits.
    params = ("-p", f"input={inp}", "-p", f"sink={kind}", "-p", "sleep_every=2", "-p", "shard_bytes=20000")
    clean_out, out = tmp_path / "clean", tmp_path / "out"
    for where, dest in (("local", clean_out), ("ray", out)):
        dest.mkdir()
        env = {**kc.FAST} if where == "local" else {
            **kc.FAST, "SEGUE_FAULTS": "ctx.after_commit:kill:3", "SEGUE_FAULTS_IN": "worker",
            "SEGUE_FAULTS_EPOCHS": "1,2"}
        proc = segue("run", kc.FLOW, "--run-id", where, *params, "-p", f"out={dest}",
                     *(on_ray(cluster) if where == "ray" else ()), env=env, timeout=300)
        assert proc.returncode == 0, (where, proc.stdout[-2000:], proc.stderr)
    clean = kc.read_output(kind, clean_out)
    kc.check_exactly_once(kc.read_output(kind, out), n, clean)
    fails = failures(segue, "ray")
    assert len(fails) == 2 and all("killed by SIGKILL" in f for f in fails), fails  # both kills landed
    # Each attempt had committed checkpoints: the reason says why the count is 1 both times.
    assert all("retry 1 of 10000" in f and "the count of failures starts over" in f for f in fails), fails
    task = store_of(segue).get_task("ray", "transform")
    assert task.epoch == 3 and task.state.value == "SUCCEEDED", task
    assert node_of(segue, "ray", "transform", 3) in {n.node_id for n in cluster.worker_nodes}


def test_node_loss_of_a_data_step_and_of_its_sub_worker_keep_the_output_exactly_once(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    """A parallel data step's sub-workers are Ray actors of their own, on other nodes than
    each other: the node of the step's worker is lost, then the node of a sub-worker."""
    kc = _kill_campaign()
    flow = str(Path(__file__).parents[1] / "data" / "flows" / "mapparallel.py")
    n = 4000
    inp = kc.make_input(tmp_path / "in", n)
    segue.env.update(kc.FAST)
    clean_out = tmp_path / "clean"
    segue("run", flow, "--run-id", "clean", "-p", f"input={inp}", "-p", f"out={clean_out}",
          timeout=300, check=True)
    clean = kc.read_output("jsonl", clean_out)
    hold, out = tmp_path / "hold", tmp_path / "out"
    segue.env.update({"MAPPARALLEL_HOLD": str(hold), "MAPPARALLEL_HOLD_K": str(n - 1),
                      "MAPPARALLEL_WORK_S": "0.004",
                      # The flow's own variables travel to the Ray nodes only when named.
                      "SEGUE_RAY_ENV": "MAPPARALLEL_HOLD,MAPPARALLEL_HOLD_K,MAPPARALLEL_WORK_S"})
    segue("run", flow, "--run-id", "par", "-p", f"input={inp}", "-p", f"out={out}", "--detach",
          *on_ray(cluster), check=True)
    store = store_of(segue)
    # 1. The node of the step's worker (the coordinator).
    explain(segue, "par", lambda: committed(store, "par", "upper", 1), 120, "a checkpoint of the first attempt")
    subs = members_of(segue, "par", "upper", 1, "sub-worker", 2)
    assert len(set(subs.values())) == 2, subs  # one CPU a node: two nodes
    lost = node_of(segue, "par", "upper", 1)
    lose_node(cluster, lost)
    # 2. Once a later attempt committed: the node of a sub-worker its coordinator is not on.
    # Ray declares a node dead only after its health checks miss (3 s here), and an attempt
    # launched meanwhile may place a member on the lost node and lose it too (CI saw
    # attempt 2 lose a sub-worker so): follow whichever attempt committed next.
    later = explain(segue, "par", lambda: max((c.epoch for c in store.list_checkpoints("par", "upper")
                                               if c.epoch >= 2), default=0), 120,
                    "a checkpoint of an attempt after the first")
    coordinator = node_of(segue, "par", "upper", later)
    assert coordinator != lost
    subs = members_of(segue, "par", "upper", later, "sub-worker", 2)
    victim = next(node for node in subs.values() if node != coordinator)
    lose_node(cluster, victim)
    wait_for(lambda: store.get_task("par", "upper").epoch > later, 120, "an attempt after the second loss")
    hold.write_text("go")
    segue.wait_state("par", {"SUCCEEDED"}, 300)
    kc.check_exactly_once(kc.read_output("jsonl", out), n, clean)
    fails = failures(segue, "par")
    first, second = fails[:later - 1], fails[later - 1:]

    def node_lost(f: str) -> bool:
        return any(w in f for w in LOST) or ("sub-worker" in f and "Ray actor" in f)

    # Each loss landed: the first cost attempt 1 its coordinator, the second cost attempt
    # `later` a sub-worker; an attempt launched before Ray saw a node dead failed only so.
    assert first and any(w in first[0] for w in LOST), fails
    assert second and "sub-worker" in second[0] and "Ray actor" in second[0], fails
    assert all(node_lost(f) for f in fails), fails


@pytest.mark.timeout(900)  # five interruptions of a two-node gang, each wait bounded on its own
def test_ddp_gang_on_two_nodes_survives_node_loss_rank_kills_and_a_pause_bit_identical(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    """Two gloo ranks on two nodes (one CPU each), with shuffling and dropout: a rank's node
    is removed at a checkpoint, the next two attempts each lose a rank (SIGKILL at its
    second vote), then the gang is paused and resumed; the weights equal an uninterrupted
    local run's, bit for bit."""
    pytest.importorskip("torch", reason="the DDP test needs torch: pip install torch")
    import torch

    ddp = str(FLOWS / "ddp.py")
    # Six epochs of 8 steps, a checkpoint every 4: room for two votes in each faulty
    # attempt before the gate at step 44, wherever the node loss left the first one.
    # (A smaller step than the flow's default keeps the longer training finite.)
    train = ("-p", "epochs=6", "-p", "lr=0.01")
    assert segue("run", ddp, "--run-id", "ref", *train, env=QUICK).returncode == 0
    gate = tmp_path / "gate"
    faults = {**QUICK, "SEGUE_FAULTS": "gang.before_vote:kill:2", "SEGUE_FAULTS_IN": "rank0,rank1",
              "SEGUE_FAULTS_EPOCHS": "2,3"}
    segue("run", ddp, "--run-id", "hit", "--detach", *train, "-p", f"gate={gate}",
          "-p", "hold=44", *on_ray(cluster), env=faults, check=True)
    store = store_of(segue)
    explain(segue, "hit", lambda: committed(store, "hit", "train", 1, 2), 180,
            "two checkpoints of the first attempt")
    ranks = members_of(segue, "hit", "train", 1, "rank", 2)
    assert len(set(ranks.values())) == 2, ranks  # the gang spans two nodes
    lose_node(cluster, ranks[1])
    explain(segue, "hit", lambda: (store.get_task("hit", "train").progress_done or 0) >= 44
            and store.get_task("hit", "train").epoch >= 4, 240, "the fourth attempt at its gate")
    assert segue("pause", "hit", "--wait", "--timeout", "60").returncode == 0
    gate.touch()
    assert segue("resume", "hit", env=QUICK).returncode == 0
    assert segue.status("hit")["state"] == "SUCCEEDED"
    ref, got = segue.output("ref", "train"), segue.output("hit", "train")
    assert got["step"] == ref["step"] == 48
    for name, w in ref["weights"].items():
        assert torch.isfinite(w).all() and torch.equal(w, got["weights"][name]), name
    fails = failures(segue, "hit")
    assert len(fails) == 3, fails  # the node loss and two rank kills, each landed once
    assert sum("exit code -9" in f for f in fails) == 2, fails
    assert store.get_task("hit", "train").attempts == 5  # lost, killed twice, paused, finished


# The torn checkpoints the issue names, on Ray (tests/integration/test_gang.py kills at
# every phase locally): a rank killed after it voted, another before it voted, and the
# coordinator between the last vote and the commit.
RAY_PHASES = [("gang.after_vote:kill:3", "rank1", None), ("gang.before_vote:kill:3", "rank0", False),
              ("gang.before_commit:kill:3", "worker", False)]


@pytest.mark.parametrize(("fault", "role", "committed"), RAY_PHASES, ids=[f"{p[0].split(':')[0]}-{p[1]}"
                                                                         for p in RAY_PHASES])
def test_a_torn_gang_checkpoint_on_ray_is_never_restored(
        segue: Segue, cluster: Any, fault: str, role: str, committed: bool | None) -> None:
    env = {**QUICK, "SEGUE_FAULTS": fault, "SEGUE_FAULTS_IN": role, "SEGUE_FAULTS_EPOCHS": "1"}
    proc = segue("run", gangkit.GANG, "--run-id", "torn", "-p", f"n={gangkit.N}", "-p", "sleep=0.002",
                 *on_ray(cluster), env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    ranks = members_of(segue, "torn", "train", 1, "rank", 2)
    assert len(set(ranks.values())) == 2, ranks  # the gang spanned two nodes
    gangkit.check_torn(segue, "torn", fault, role, committed)


def test_what_ray_cannot_run_is_refused_at_submit_in_one_line(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    big = tmp_path / "big.py"
    big.write_text("from segue import Flow\nflow = Flow('big')\n"
                   "@flow.step(gpus=4)\ndef train(ctx):\n    return 1\n")
    proc = segue("run", str(big), *on_ray(cluster))
    assert proc.returncode == 2, proc.stderr
    assert "step 'train' needs 1 CPUs and 4 GPUs on one Ray node, but the largest node of the " \
           "cluster has 1 CPUs and 1 GPUs" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    wide = tmp_path / "wide.py"
    wide.write_text("from segue import Flow\nfrom segue.data import JsonlSink, SequenceSource\n"
                    "flow = Flow('wide')\n"
                    "@flow.map(source=lambda ctx: SequenceSource([1, 2]), sink=lambda ctx: JsonlSink('o'),"
                    " workers=4)\ndef f(r):\n    return {'r': r}\n")
    proc = segue("run", str(wide), *on_ray(cluster))
    assert proc.returncode == 2, proc.stderr
    assert "step 'f' needs 5 CPUs and 0 GPUs on Ray in all (its worker and 4 sub-workers, 1 CPUs " \
           "each), but the cluster has 3 CPUs and 3 GPUs" in proc.stderr, proc.stderr
    proc = segue("run", str(FLOWS / "counter.py"), "--executor", "ray", "--ray-address", "127.0.0.1:1")
    assert proc.returncode == 2 and "cannot reach the Ray cluster at 127.0.0.1:1" in proc.stderr, proc.stderr
    assert segue.json("ls") == []  # nothing was created


def test_what_sub_workers_print_on_their_nodes_reaches_segue_logs(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    from segue.executor.ray import actor_name, member_name

    flow, hold = tmp_path / "chatty_map.py", tmp_path / "hold"
    flow.write_text("import os, time\nfrom segue import Flow\nfrom segue.data import JsonlSink, SequenceSource\n"
                    "flow = Flow('chatty_map', params={'out': 'out', 'hold': ''})\n"
                    "@flow.map(source=lambda ctx: SequenceSource(list(range(40)), shards=4),"
                    " sink=lambda ctx: JsonlSink(ctx.params['out']), workers=2)\n"
                    "def f(r):\n    print(f'record {r} on node {os.environ[\"SEGUE_RAY_NODE_ID\"][:8]}')\n"
                    "    return {'r': r}\n"
                    "@flow.step(after=[f])\n"
                    "def gate(ctx):\n    while not os.path.exists(ctx.params['hold']):\n        time.sleep(0.05)\n")
    proc = segue("run", str(flow), "--run-id", "chatty", "-p", f"out={tmp_path / 'out'}", "-p", f"hold={hold}",
                 "--detach", *on_ray(cluster), env=QUICK)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    store = store_of(segue)
    explain(segue, "chatty", lambda: store.get_task("chatty", "gate").state.value == "RUNNING", 120,
            "the step after the map step")
    # A fixed number of sub-workers: their actors were created with the attempt's, and
    # they ended with it, while the controller (their owner) still drives the run.
    warm = [member_name(actor_name(segue.home, "chatty", "f", 1), i) for i in range(2)]

    def gone(name: str) -> bool:
        try:
            ray.get_actor(name, namespace="segue")
        except ValueError:
            return True
        return False

    wait_for(lambda: all(gone(n) for n in warm), 30, "the warmed sub-workers' actors to end")
    hold.touch()
    segue.wait_state("chatty", {"SUCCEEDED"}, 120)
    logs = segue("logs", "chatty").stdout
    said = re.findall(r"^record (\d+) on node ([0-9a-f]{8})$", logs, flags=re.M)
    assert sorted(int(r) for r, _ in said) == list(range(40)), logs[-3000:]  # every line, whole
    members = members_of(segue, "chatty", "f", 1, "sub-worker", 2)
    assert {node for _, node in said} == {n[:8] for n in members.values()}, (said, members)
    warmed = re.findall(r"sub-worker (\d+) runs on Ray node [0-9a-f]+ \(warmed with the attempt\)", logs)
    assert sorted(warmed) == ["0", "1"], logs[-3000:]


def test_an_elastic_step_on_ray_gives_a_gpu_to_an_urgent_ray_run_and_grows_back(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    """An elastic step (workers=(1, 3), a GPU each) grows to the cluster's three GPUs; an
    urgent Ray run needs one: the pool promises it one of the step's, the step stops the
    sub-worker on it (its actor ends, Ray frees the GPU) and goes on with two, the urgent
    run's actor gets that GPU, and the step grows back. Never paused; every record once."""
    def rows() -> list[dict[str, Any]]:
        return [json.loads(line) for p in sorted(out.glob("*.jsonl")) for line in p.read_text().splitlines()]

    def workers() -> int:
        scales = [e for e in segue.events("low") if e["kind"] == "scale"]
        return scales[-1]["data"]["workers"] if scales else 1

    # 5 ms a record while the slow file exists: a sub-worker's batch (and so a barrier,
    # where the step shrinks) takes about 2.5 s; the test decides when the run may end.
    slow, out, n = tmp_path / "slow", tmp_path / "out", 40000
    slow.touch()
    env = {"ELASTIC_SLOW_FILE": str(slow), "ELASTIC_DELAY": "0.005",
           "SEGUE_RAY_ENV": "ELASTIC_SLOW_FILE,ELASTIC_DELAY"}
    segue("run", str(FLOWS / "elastic.py"), "--detach", "--run-id", "low", "--priority", "batch",
          "-p", f"n={n}", "-p", f"out={out}", *on_ray(cluster), env=env, check=True)
    explain(segue, "low", lambda: workers() == 3 and len({r["node"] for r in rows()}) == 3, 180,
            "committed rows from 3 sub-workers on 3 nodes")
    segue("run", str(FLOWS / "gpujob.py"), "--detach", "--run-id", "hi", "--priority", "urgent",
          "-p", "n=40", *on_ray(cluster), check=True)
    explain(segue, "hi", lambda: segue.status("hi")["state"] == "SUCCEEDED", 180, "the urgent run to finish")
    assert segue.status("low")["state"] == "RUNNING"  # it went on with two sub-workers meanwhile
    explain(segue, "low", lambda: workers() == 3, 180, "the elastic step to grow back to 3")
    slow.unlink()
    explain(segue, "low", lambda: segue.status("low")["state"] == "SUCCEEDED", 300, "the batch run to finish")
    events = segue.events("low")
    assert {e["to_state"] for e in events if e["kind"] == "run"} == {"PENDING", "RUNNING", "SUCCEEDED"}
    gave = [e for e in events if e["kind"] == "scheduler" and e["data"].get("partial")]
    assert len(gave) == 1 and "preempted by run 'hi' (urgent)" in gave[0]["reason"], gave
    scales = [e for e in events if e["kind"] == "scale"]
    downs = [e for e in scales if e["data"]["direction"] == "down" and "partial" in e["reason"]]
    assert len(downs) == 1 and downs[0]["data"]["workers"] == 2, scales
    assert any(e["data"]["direction"] == "up" and e["data"]["workers"] == 3
               for e in scales[scales.index(downs[0]) + 1:]), scales
    got = rows()
    assert sorted(r["k"] for r in got) == list(range(n)) and all(r["v"] == r["k"] ** 2 for r in got)
    # The urgent run's actor ran on a node whose GPU the elastic step had held.
    assert node_of(segue, "hi", "work", 1) in {r["node"] for r in got}
    assert segue.status("low")["accounting"]["partial_preemptions"] == 1


def test_on_postgres_and_s3_a_node_needs_no_shared_disk_and_survives_its_loss(
        segue: Segue, cluster: Any, counter_ref: Any, pg: Any, s3_endpoint: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster setup of issue 11 on Ray: the store is PostgreSQL and checkpoints are in
    S3, so a node keeps a home of its own (never the controller's path) and the run reads
    and writes nothing of the controller's disk but its logs."""
    from s3kit import s3_bucket

    bucket, aws = s3_bucket(s3_endpoint)
    url = pg.create_database()
    for k, v in {**aws, "SEGUE_STORE": url}.items():  # this process reads the same store and bucket
        monkeypatch.setenv(k, v)
    segue.env.update({**aws, "SEGUE_STORE": url, **QUICK,
                      "SEGUE_RAY_ENV": ",".join(sorted(aws))})  # S3 credentials travel by name
    counter = str(FLOWS / "counter.py")
    proc = segue("run", counter, "--run-id", "nope", *on_ray(cluster))
    assert proc.returncode == 2, proc.stderr
    assert "on Ray with a PostgreSQL store the nodes do not share this home; pass --checkpoints" \
        in proc.stderr, proc.stderr
    gate = Path(segue.home.parent) / "gate"
    segue("run", counter, "--run-id", "pgs3", "--detach", "-p", "n=200", "-p", f"hold={gate}",
          "--checkpoints", f"s3://{bucket}/segue", *on_ray(cluster), check=True)
    store = store_of(segue)
    explain(segue, "pgs3", lambda: committed(store, "pgs3", "count", 1, 2), 120,
            "two checkpoints of the first attempt")
    lost = node_of(segue, "pgs3", "count", 1)
    lose_node(cluster, lost)
    wait_for(lambda: committed(store, "pgs3", "count", 2), 120, "a checkpoint of attempt 2")
    assert node_of(segue, "pgs3", "count", 2) != lost
    gate.touch()
    segue.wait_state("pgs3", {"SUCCEEDED"}, 120)
    same_counter(segue, "pgs3", counter_ref(200))
    assert len(lost_attempts(segue, "pgs3")) == 1, failures(segue, "pgs3")
    # The checkpoints and outputs are in the bucket; none on the controller's disk.
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="segue/runs/pgs3/")["Contents"]]
    assert any("/count/ckpt/" in k for k in keys) and any("/report/output-" in k for k in keys), keys
    assert not (Home.resolve(segue.home).data_dir / "runs").exists()


def test_ckpt_now_reaches_a_worker_on_a_ray_node_through_its_actor(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    segue("run", str(FLOWS / "ondemand.py"), "--run-id", "od", "--detach", "-p", f"gate={gate}",
          *on_ray(cluster), check=True)
    store = store_of(segue)
    explain(segue, "od", lambda: (store.get_task("od", "loop").progress_done or 0) > 0, 120,
            "the step running")
    assert store.list_checkpoints("od", "loop") == []  # an hour's interval: none of its own
    proc = segue("ckpt", "now", "od")
    assert proc.returncode == 0 and "asked loop to checkpoint now" in proc.stdout, proc.stderr
    wait_for(lambda: len(store.list_checkpoints("od", "loop")) == 1, 60, "the asked-for checkpoint")
    gate.touch()
    segue.wait_state("od", {"SUCCEEDED"}, 60)
    assert len(store.list_checkpoints("od", "loop")) == 1
    proc = segue("ckpt", "now", "od")
    assert proc.returncode == 2, proc.stderr
    assert "run 'od' has no running task on its Ray cluster to checkpoint" in proc.stderr, proc.stderr


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_segues_ray_processes_do_not_import_pyarrow_for_ray_serializers_they_never_use(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    """Ray imports pyarrow (and starlette, pydantic) in every process on its first call,
    to register serializers for their types (executor.ray_lean). The controller, the
    attempt's actor, its worker and the sub-workers' actors of a data step on Ray all
    made such calls, and none of them loaded pyarrow; a plain actor on the same cluster
    did, so the check could fail."""
    pytest.importorskip("pyarrow", reason="the premise: Ray imports pyarrow where it is installed")
    flow, hold, seen = tmp_path / "held_map.py", tmp_path / "hold", tmp_path / "seen"
    seen.mkdir()
    flow.write_text("import os, time\nfrom segue import Flow\nfrom segue.data import JsonlSink, SequenceSource\n"
                    "flow = Flow('held_map', params={'out': 'out', 'hold': '', 'seen': ''})\n"
                    "@flow.map(source=lambda ctx: SequenceSource(list(range(4)), shards=2),"
                    " sink=lambda ctx: JsonlSink(ctx.params['out']), workers=2)\n"
                    "def f(r):\n    open(os.path.join(os.environ['SEEN'], str(os.getppid())), 'w').close()\n"
                    "    while not os.path.exists(os.environ['HOLD']):\n        time.sleep(0.05)\n"
                    "    return {'r': r}\n")
    env = {**QUICK, "HOLD": str(hold), "SEEN": str(seen), "SEGUE_RAY_ENV": "HOLD,SEEN"}
    proc = segue("run", str(flow), "--run-id", "lean", "-p", f"out={tmp_path / 'out'}", "--detach",
                 *on_ray(cluster), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    # Each sub-worker's parent is its actor's process: both are at work, held.
    members = explain(segue, "lean", lambda: [int(p.name) for p in seen.iterdir()] if len(list(seen.iterdir())) == 2
                      else None, 120, "both sub-workers at work")
    log = segue.home / "logs" / "lean" / "f.e1.log"
    attempt = int(wait_for(lambda: re.search(r"actor pid (\d+)", log.read_text()) if log.exists() else None,
                           60, "the attempt's actor pid in its log").group(1))
    worker = wait_for(lambda: next((int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                                    and _ppid(p) == attempt and b"_worker_main" in _cmdline(p)), None),
                      30, "the worker process, the attempt's actor's child")
    controller = store_of(segue).get_run("lean").controller_pid
    assert controller is not None
    loaded = {name: "arrow" in _maps(pid) for name, pid in
              [("controller", controller), ("attempt's actor", attempt), ("worker", worker),
               *((f"sub-worker actor {pid}", pid) for pid in members)]}
    hold.touch()
    segue.wait_state("lean", {"SUCCEEDED"}, 120)

    @ray.remote(num_cpus=0)
    class Plain:
        def pid(self, x: int) -> int:
            return os.getpid() + 0 * x

    plain = Plain.remote()
    control = _maps(ray.get(plain.pid.remote(1)))
    ray.kill(plain)
    assert "arrow" in control, "a plain Ray actor did not load pyarrow: this test proves nothing here"
    assert not any(loaded.values()), loaded


def _ppid(p: Path) -> int:
    try:
        stat = (p / "stat").read_text()
    except OSError:
        return -1
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""
