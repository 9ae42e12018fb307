"""`segue verify` proves a correct flow unchanged under faults, and catches a leaky one."""

from __future__ import annotations

import json

from segue_helpers import FLOWS, Segue


def test_verify_passes_for_a_checkpointed_flow(segue: Segue) -> None:
    proc = segue("verify", str(FLOWS / "counter.py"), "-p", "n=300", "-p", "sleep=0.004",
                 "--kills", "4", "--pauses", "1", "--seed", "2", "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert sum(doc["faults_injected"].values()) == 5
    assert doc["records_lost"] == doc["records_duplicated"] == doc["records_differing"] == 0
    assert doc["differing_step_outputs"] == []


def test_verify_catches_duplicates_from_an_unprotected_side_effect(segue: Segue) -> None:
    proc = segue("verify", str(FLOWS / "leaky.py"), "-p", "n=300", "--kills", "4", "--pauses", "0",
                 "--seed", "1", "--json", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False
    assert doc["records_duplicated"] > 0 and doc["records_lost"] == 0
    assert doc["records_compared"] == 300


def test_verify_rejects_bad_input_before_running(segue: Segue, tmp_path) -> None:
    proc = segue("verify", str(tmp_path / "missing.py"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("segue: flow file ")
    proc = segue("verify", str(FLOWS / "counter.py"), "-p", "n=x")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "segue: parameter 'n' expects int, got 'x'; pass --param n=<int>"
