"""Every benchmark runs in its --smoke mode and ends with its JSON summary line.

Each one runs as its users run it (`python -m benchmarks.NAME --smoke --json`,
a real subprocess from the repository root), so a benchmark that rots (an API
it calls changed, a key went missing) fails here instead of on release day.
The figures of a smoke run mean nothing; only that it ran and what it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED: dict[str, set[str]] = {
    "recovery": {"pause_latency_s", "resume_latency_s", "recovery_s", "lost_work_s",
                 "floor_worker_startup_s", "samples"},
    "preemption": {"time_to_device_s", "victim_lost_work_s", "kill_requeue_lost_work_s",
                   "kill_requeue_downtime_s", "lost_work_vs_kill_requeue", "all_outputs_complete"},
    "checkpoint": {"save_vs_disk", "block_vs_memcpy", "memcpy_s", "raw_write_s", "save_s",
                   "async_block_s", "async_total_s", "load_vs_disk", "all_runs_s", "goals",
                   "copy_threads", "io_threads"},
    "pipeline": {"records", "vs_plain_loop", "scale_2_workers", "vs_beam", "vs_ray_data",
                 "resume_at_90pct_s", "output_verified", "runs", "goals"},
    "elastic": {"partial_time_to_device_s", "whole_time_to_device_s", "partial_batch_rate_during_urgent",
                "whole_batch_rate_during_urgent", "batch_wall_partial_vs_whole", "floor_worker_startup_s",
                "outputs_equal"},
    "cluster": {"failover_s", "failover_to_step_s", "failover_lease_ttl_s", "lost_records", "dup_records",
                "pg_vs_sqlite_1_writers", "pg_vs_sqlite_16_writers", "pg_vs_raw_psycopg_16_writers",
                "synchronous_commit", "fsync_per_s", "s3_vs_local_save",
                "s3_vs_local_restore", "goals"},
    "scale": {"gang_ckpt_vs_single", "gang_vs_disk", "vs_dcp", "gang_save_s", "single_save_s",
              "raw_write_s", "states_equal", "best_of", "one_tensor", "not_measured", "goals", "efficiency_2_workers", "vs_ray_data",
              "node_loss_recovery_s", "ray_node_death_detection_s", "ray_workers_s", "local_workers_s",
              "ray_data_2w_s", "ray_cluster"},
    "generate": {"vs_plain_generate", "vs_ray_data", "pause_s", "tokens_regenerated_after_preemption",
                 "decode_tokens_per_s", "output_verified", "not_measured", "runs", "goals"},
    "fanout": {"fanout_10k_create_s", "status_10k_s", "status_10k_pending_s", "goals"},
    "queues": {"vs_plain_consumer", "plain_s", "segue_s", "redelivered_after_kill",
               "time_to_first_new_ack_s", "kill", "outputs_equal", "goals"},
    "server": {"requests_per_s", "status_p99_s", "runs_page_10k_s", "pause_to_paused_s",
               "pause_to_paused_cli_s", "pause_tries_per_side", "server_rss_bytes", "load_errors",
               "goals"},
}


@cache  # each benchmark runs once per session, whatever asks for it
def run_smoke(name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--smoke", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"benchmarks.{name} --smoke exited {proc.returncode}:\n" \
                                 f"{proc.stderr[-3000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"benchmarks.{name} --smoke printed nothing"
    return json.loads(lines[-1])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_benchmark_smoke_prints_its_summary(name: str) -> None:
    got = run_smoke(name)
    if "skipped" in got:  # benchmarks.cluster without the PostgreSQL server binaries
        pytest.skip(got["skipped"])
    missing = EXPECTED[name] - set(got)
    assert not missing, f"benchmarks.{name} --smoke lacks {sorted(missing)}"


def test_pipeline_smoke_verifies_every_output_and_states_its_goals() -> None:
    got = run_smoke("pipeline")
    assert got["output_verified"]["every_run_matched"] is True
    assert got["output_verified"]["records"] == got["records"]
    for side in ("plain", "segue_1w", "segue_2w", "inprocess"):
        assert got["runs"][side], f"no {side} run"
        assert all(r["verified"] for r in got["runs"][side])
    for key in ("vs_plain_loop", "scale_2_workers", "vs_beam", "vs_ray_data", "resume_at_90pct_s"):
        goal = got["goals"][key]
        assert set(goal) == {"target", "value", "met"}
    # The pause landed at the held record (90%), not at the end: resume had work to do.
    assert got["resume_paused_at_records"] < got["resume_input_records"]


def test_checkpoint_smoke_states_its_goals() -> None:
    got = run_smoke("checkpoint")
    assert set(got["goals"]) == {"save_vs_disk", "block_vs_memcpy"}
    assert got["goals"]["block_vs_memcpy"]["met"] == (got["block_vs_memcpy"] <= 1.5)
    # every side got the same number of tries
    assert len({len(v) for v in got["all_runs_s"].values()}) == 1


def test_server_smoke_states_its_goals_and_counts_its_errors() -> None:
    got = run_smoke("server")
    assert set(got["goals"]) == {"status_p99_s", "runs_page_10k_s"}
    assert all(set(g) == {"target", "value", "met"} for g in got["goals"].values())
    assert got["load_errors"] == {"saturated": {}, "paced": {}}
    # the API and the CLI got the same number of pause tries
    tries = got["pause_tries_per_side"]
    assert len(got["samples"]["pause_api_s"]) == len(got["samples"]["pause_cli_s"]) == tries


def test_generate_smoke_checks_tokens_and_parks_mid_generation() -> None:
    got = run_smoke("generate")
    assert got["output_verified"]["every_run_matched"] is True
    assert got["runs"]["plain"] and got["runs"]["segue"]  # every side the same tries
    assert len(got["runs"]["plain"]) == len(got["runs"]["segue"]) == got["tries_per_side"]
    assert set(got["goals"]) == {"vs_plain_generate", "vs_ray_data", "pause_s"}
    # a figure is measured, or null with its reason
    assert (got["vs_ray_data"] is None) == ("vs_ray_data" in got["not_measured"])
    # The paused run's output is checked token for token; at smoke sizes the run may end before
    # the pause lands (CI saw one attempt), so a second attempt is not required here.
    assert got["pause"]["attempts"] >= 1 and got["pause"]["output_verified"] is True
    assert got["tokens_regenerated_after_preemption"] >= 0
    assert got["pause"]["tokens_published"] == got["output_verified"]["tokens"]


def test_gpu_checkpoint_smoke_skips_or_measures() -> None:
    got = run_smoke("gpu_checkpoint")
    if "skipped" in got:
        assert "GPU" in got["skipped"] or "CUDA" in got["skipped"] or "torch" in got["skipped"]
    else:
        assert got["restored_equal_on_gpu"] is True


def test_scale_smoke_measures_the_ray_figures_or_says_why() -> None:
    got = run_smoke("scale")
    for key in ("efficiency_2_workers", "vs_ray_data", "node_loss_recovery_s"):
        assert set(got["goals"][key]) == {"target", "value", "met"}
        # a figure is either measured or null with its reason
        assert (got[key] is None) == (key in got["not_measured"]), (key, got[key], got["not_measured"])
    if got["ray_workers_s"] is not None:  # Ray ran: every output was checked first
        assert got["ray_output_verified"]["every_run_matched"] is True
        assert set(got["ray_workers_s"]) == set(got["local_workers_s"]) == {"1", "2", "4"}


def test_scale_smoke_pairs_its_saves_and_prints_both_states() -> None:
    got = run_smoke("scale")
    for figures in (got, got["one_tensor"]):
        assert figures["states_equal"] is True
        n = figures["saves_per_side"]
        assert {len(t) for t in figures["samples"].values()} == {n}  # every side the same saves
        for key in ("gang_ckpt_vs_single", "gang_vs_disk"):
            assert figures[key] is not None and key in figures["best_of"]
    assert got["state"]["small_per_rank"] > 0 and got["one_tensor"]["state"]["large_per_rank"] == 1


def test_gang_states_never_repeat_an_array() -> None:
    """benchmarks.scale's sides save the same state; segue does not write again an array
    whose bytes it stored already, DCP does. So no array may hold the bytes of another,
    at this save or the next, or the sides would not do the same work."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "flows"))
    try:
        from gang_state import rank_state
    finally:
        sys.path.pop(0)
    seen: dict[bytes, str] = {}
    for k in range(3):
        for rank in range(2):
            state = rank_state(rank, 1, 4, 50, k)
            assert len(state) == 54
            for key, a in state.items():
                assert seen.setdefault(a.tobytes(), f"{key}@{k}") == f"{key}@{k}", \
                    f"{key} after {k} saves holds the bytes of {seen[a.tobytes()]}"
                assert (a == rank_state(rank, 1, 4, 50, 0)[key] + k).all()  # each save adds exactly 1.0


def test_benchmarks_type_check() -> None:
    """benchmarks.gpu_checkpoint runs only on a GPU: without one its smoke run skips
    before it calls anything, so it cannot catch an API change (it once passed a list
    where ``_floors.raw_write`` takes a ``Layout``, unnoticed). The type check does, for
    every benchmark, GPU or not. segue ships no py.typed, so this run takes segue's own
    API as Any; ``make lint``'s mypy (files: src/segue and benchmarks) checks that too."""
    pytest.importorskip("mypy")
    cmd = [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental",
           f"--cache-dir={os.devnull}", str(ROOT / "benchmarks")]  # no cache written
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, \
        f"mypy benchmarks exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"


def test_queues_smoke_checks_its_outputs_and_counts_its_kill() -> None:
    got = run_smoke("queues")
    if "skipped" in got:  # no redis-server here: said by the benchmark
        pytest.skip(got["skipped"])
    assert got["outputs_equal"] is True and got["vs_plain_consumer"] > 0
    assert got["kill"]["kills_landed"] == 1, got["kill"]  # the SIGKILL landed, once
    assert got["kill"]["xpending_at_end"] == 0  # every message acknowledged in the end
    assert got["redelivered_after_kill"] >= 0 and got["time_to_first_new_ack_s"] > 0
