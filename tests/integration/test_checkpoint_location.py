"""`segue run --checkpoints`: a location the run could not use is refused at submit,
in one line, with nothing written; a good one holds everything of the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3kit import s3_bucket
from segue_helpers import FLOWS, Segue

COUNTER = str(FLOWS / "counter.py")


@pytest.mark.parametrize(("where", "says"), [
    ("relative/dir", "must be an absolute path or a URL"),
    ("nosuchproto://x/y", "Protocol not known: nosuchproto"),
])
def test_a_location_that_cannot_work_is_refused_at_submit(segue: Segue, where: str, says: str) -> None:
    proc = segue("run", COUNTER, "--run-id", "bad", "--checkpoints", where)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert segue("status", "bad").returncode == 2  # no run was created


def test_an_unwritable_bucket_names_the_credentials(segue: Segue, s3_endpoint: str) -> None:
    _, env = s3_bucket(s3_endpoint)
    proc = segue("run", COUNTER, "--run-id", "bad", "--checkpoints", "s3://segue-no-such-bucket/x", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write checkpoints to s3://segue-no-such-bucket/x" in proc.stderr
    assert "AWS_ACCESS_KEY_ID" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert segue("status", "bad").returncode == 2


def test_an_absolute_path_holds_checkpoints_and_outputs(segue: Segue, tmp_path: Path) -> None:
    where = tmp_path / "shared" / "ckpts"
    proc = segue("run", COUNTER, "--run-id", "p", "-p", "n=50", "-p", "sleep=0", "--checkpoints", str(where))
    assert proc.returncode == 0, proc.stderr
    assert segue.output("p", "count")["i"] == 50
    assert (where / "runs" / "p" / "count").is_dir()
    assert not (segue.home / "data" / "runs" / "p").exists()
    assert not list(where.glob(".segue-probe-*"))  # the submit probe was removed


def test_object_storage_retries_leave_the_global_random_stream_alone(
        s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore draws retry jitter from Python's global random; once segue opens S3
    storage, its retries draw from a private generator, so a step's random stream does
    not move when a checkpoint write is retried (segue._rngshield)."""
    import random

    bucket, env = s3_bucket(s3_endpoint)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    from segue.home import storage_at

    storage_at(f"s3://{bucket}/ck")
    import botocore.retries.standard as standard
    import botocore.retryhandler as legacy

    random.seed(3)
    before = random.getstate()
    delay = standard.ExponentialBackoff().delay_amount(standard.RetryContext(attempt_number=3))
    assert 0 <= delay <= 4 and legacy.delay_exponential(base="rand", growth_factor=2, attempts=3) >= 0
    assert random.getstate() == before
