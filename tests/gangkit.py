"""Checks shared by the gang tests, local and on Ray: the gang flow's expected output, and
what a kill at one phase of a gang checkpoint must leave (tests/flows/gang.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from segue_helpers import FLOWS, Segue, flow_module

from segue import checkpoint as ckpt
from segue.home import Home

GANG = str(FLOWS / "gang.py")
_gang = flow_module("gang")
QUICK = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
N = 40


def open_run(segue: Segue, run: str) -> tuple[Any, Any]:
    home = Home.resolve(segue.home)
    store = home.open_store()
    return store, home.run_storage(store.get_run(run))


def check_whole(segue: Segue, run: str) -> list[dict[str, Any]]:
    """Every committed checkpoint is whole: its gang manifest names both ranks' shards,
    each verifies, matches the hash its rank voted, and both stopped at the same step.
    Returns the newest one's rank states."""
    from segue.run.gang import manifest_digest

    store, storage = open_run(segue, run)
    committed = store.list_checkpoints(run, "train")
    assert committed, "no committed checkpoint"
    newest: list[dict[str, Any]] = []
    for c in committed:
        gang = ckpt.load(storage, c.path).state["state"]["gang"]
        assert gang["world_size"] == 2 and [r["rank"] for r in gang["ranks"]] == [0, 1]
        states = []
        for r in gang["ranks"]:
            assert r["path"] == f"{c.path}/rank-{r['rank']}"
            assert manifest_digest(storage, r["path"])[0] == r["manifest_sha256"]
            states.append(ckpt.load(storage, r["path"]).state["state"])
        assert states[0]["i"] == states[1]["i"] == c.position["ranks"][0]["i"], (c.seq, states)
        newest = newest or states
    return newest


def check_output(segue: Segue, run: str) -> None:
    out = segue.output(run, "train")
    assert out == {"i": N, "acc": _gang.expected_acc(0, N), "rank": 0, "world_size": 2}
    last = check_whole(segue, run)
    for rank, state in enumerate(last):  # rank 1's work too: nothing lost or repeated
        assert state["i"] == N and state["acc"] == _gang.expected_acc(rank, N), rank


def failures(segue: Segue, run: str) -> list[str]:
    return [e["reason"] for e in segue.events(run)
            if e["actor"] == "failure-detector" and e["kind"] == "task"]


# Every phase of a gang checkpoint's commit, at its third checkpoint (seq 3), in the
# first attempt only: (fault, the process it kills, is seq 3 committed afterwards?).
PHASES = [
    ("gang.before_vote:kill:3", "rank1", False),  # rank 1's shard is written, not voted
    ("gang.after_vote:kill:3", "rank1", None),  # voted: the commit may or may not win the race
    ("gang.before_manifest:kill:3", "worker", False),  # every vote in, no gang manifest
    ("gang.before_commit:kill:3", "worker", False),  # gang manifest durable, no store record
    ("ctx.after_commit:kill:3", "worker", True),  # committed; the ranks were never told
]


def check_torn(segue: Segue, run: str, fault: str, role: str, committed: bool | None) -> None:
    """The kill of ``fault`` in ``role`` landed once, no partial checkpoint was restored or
    left behind, the retry went on from the last committed one and said so, and the
    output is an uninterrupted run's."""
    store, storage = open_run(segue, run)
    assert store.get_task(run, "train").attempts == 2  # the first attempt died of it
    [why] = failures(segue, run)
    if role.startswith("rank"):
        assert f"rank {role[4:]}" in why and "-9" in why, why
    else:
        assert "SIGKILL" in why, why
    everything = store.list_checkpoints(run, "train", statuses=("committed", "pruned", "quarantined"))
    by_seq = {c.seq: c for c in everything}
    # The retry restored the newest committed checkpoint of the first attempt...
    first = max(c.seq for c in everything if c.epoch == 1)
    assert first in ((3,) if committed else (2,) if committed is False else (2, 3)), sorted(by_seq)
    # ...and said so: the retry names the checkpoint it goes on from, and the torn one.
    said = [e.reason for e in store.list_events(run) if e.kind == "checkpoint"]
    assert any(f"resumes from committed checkpoint {first}" in r for r in said), said
    torn = f"runs/{run}/train/ckpt/{3:08d}-e1"
    if role == "worker" and not committed:  # the coordinator died between the phases
        assert any(f"uncommitted checkpoint {torn} removed" in r for r in said), said
    if fault.startswith("gang.before_vote"):  # the coordinator saw the rank die before it voted
        aborted = [re.search(r"missing: \[([0-9, ]*)\]", r) for r in said
                   if "checkpoint 3 of gang step 'train' aborted" in r]
        assert any(m and int(role[4:]) in json.loads(f"[{m.group(1)}]") for m in aborted), said
    # Seq 3 of the first attempt: whole and committed, or never there at all.
    if 3 not in by_seq or by_seq[3].epoch != 1:
        assert not storage.exists(f"{torn}/MANIFEST.json") and not storage.listdir(torn), \
            "an uncommitted gang checkpoint was left behind"
    check_output(segue, run)
