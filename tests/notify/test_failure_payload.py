"""A failure's webhook carries the error `segue status` shows: a real run that fails,
the real CLI, a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from segue_helpers import FLOWS, Segue, wait_for
from test_webhooks import receiver

CHATTY = str(FLOWS / "chatty.py")
COUNTER = str(FLOWS / "counter.py")


def add_hook(segue: Segue, url: str, events: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret-" + "x" * 24 + "\n")
    proc = segue("webhook", "add", url, "--events", events, "--secret-file", str(secret))
    assert proc.returncode == 0, proc.stderr


def test_failed_run_notification_carries_the_steps_error(segue: Segue, tmp_path: Path) -> None:
    with receiver() as rec:
        add_hook(segue, rec.url, "failed,paused", tmp_path)
        # `bad` (retries=0) raises; the run's own reason only says it ran out of retries.
        proc = segue("run", CHATTY, "--run-id", "f")
        assert proc.returncode == 1, proc.stderr
        [got] = wait_for(lambda: rec.accepted(), 30, "the failed notification")
        # An operator's pause is no failure: its notification has no error.
        hold = tmp_path / "hold"
        segue("run", COUNTER, "--run-id", "p", "-p", f"hold={hold}", "--detach", check=True)
        wait_for(lambda: segue.step("p", "count")["last_checkpoint"], 60, "a checkpoint")
        assert segue("pause", "p", "--wait", "--timeout", "60").returncode == 0
        paused = wait_for(lambda: [r for r in rec.accepted() if r.doc["run_id"] == "p"], 30,
                          "the paused notification")
    status = segue.step("f", "bad")
    assert status["state"] == "FAILED" and "always broken" in status["error"], status
    doc = got.doc
    assert (doc["event"], doc["run_id"]) == ("failed", "f")
    assert "always broken" not in doc["reason"]  # so the error must come on its own
    assert doc["error"] == status["error"]
    assert doc["errors"] == {"bad": status["error"]}
    assert (paused[0].doc["error"], paused[0].doc["errors"]) == (None, {})
