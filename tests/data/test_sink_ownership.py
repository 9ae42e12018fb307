"""A sink's output belongs to one run: refusal, append, overwrite, restart (in-process, real files and SQLite).

Each run is a FakeRun with its own run id; each attempt builds a fresh sink,
as a new process would. The CLI-level tests (real runs, real SIGKILLs) are
in test_sink_ownership_cli.py.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest
from fakectx import FakeRun, read_jsonl_dir

from segue.data import JsonlSink, JsonlSource, ParquetSink, SequenceSource, SqlSink, run_map
from segue.data.sinks.owner import published_parts, read_marker, tag_of
from segue.errors import DataError, SinkOwnedError
from segue.run.context import Park
from segue.verify.compare import snapshot_files


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


def recs(n: int, tag: str) -> list[dict]:
    return [{"k": i, "v": f"{tag}{i}"} for i in range(n)]


def ident(r: dict) -> dict:
    return r


def run_file(run_id: str, out: Path, n: int, tag: str, mode: str = "new", kind: str = "jsonl",
             **attempt: object) -> FakeRun:
    run = FakeRun(run_id, "write")
    sink = JsonlSink(out, mode=mode) if kind == "jsonl" else ParquetSink(out, mode=mode)
    run_map(run.attempt(**attempt), SequenceSource(recs(n, tag), shards=2), ident, sink)
    return run


def published_records(out: Path) -> list[dict]:
    """What a reader of the directory sees: segue's own source over it."""
    src = JsonlSource(str(out))
    got: list[dict] = []
    for shard in src.shards(src.snapshot()):
        for b in shard.read(shard.start(), 1000):
            got.extend(b.records)
    return got


def files_of(out: Path, run_id: str) -> list[str]:
    return sorted(p.name for p in out.glob(f"part-{tag_of(run_id, 'write')}-*"))


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_second_run_into_an_owned_directory_is_refused_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    run_file("nightly-1", out, 50, "a", kind=kind)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(SinkOwnedError, match=r"^.*/out belongs to run 'nightly-1' \(step 'write'\); "
                                             r"write to another directory, or pass mode='append'"):
        run_file("nightly-2", out, 50, "b", kind=kind)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before  # not one byte changed, no part of nightly-2
    assert not (out / ".segue-staging" / "nightly-2").exists() or not any(
        (out / ".segue-staging" / "nightly-2").rglob("*.*"))
    assert SinkOwnedError("x").segue_retryable is False  # the engine fails the step, no retries


def test_the_owning_run_resumes_into_its_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = FakeRun("own", "write")
    src = SequenceSource(recs(40, "a"), shards=2)
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=1), src, ident, JsonlSink(out))
    run_map(run.attempt(), src, ident, JsonlSink(out))
    assert sorted(r["k"] for r in read_jsonl_dir(out)) == list(range(40))


def test_directory_with_unclaimed_parts_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000.0000-00000000.jsonl").write_text('{"k": 1}\n')
    with pytest.raises(SinkOwnedError, match=r"already holds 1 part files that no segue run claims"):
        run_file("r", out, 5, "a")
    run_file("r2", out, 5, "b", mode="append")  # explicit: adopt them and add
    assert sorted(r["k"] for r in published_records(out)) == sorted([1, *range(5)])


def test_append_adds_to_the_published_set(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_file("a", out, 30, "a")
    run_file("b", out, 20, "b", mode="append")
    got = sorted(r["v"] for r in published_records(out))
    assert got == sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(20)])
    assert [m["run_id"] for m in read_marker(str(out))["members"]] == ["a", "b"]


def test_overwrite_replaces_the_old_set_at_its_first_commit_never_before(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_file("old", out, 30, "a")
    old_set = published_parts(str(out))
    assert old_set and set(old_set) == set(files_of(out, "old"))
    run = FakeRun("new", "write")
    src = SequenceSource(recs(40, "b"), shards=4)
    # Opened, not committed yet: readers still see the old run's records.
    sink = JsonlSink(out, mode="overwrite")
    from segue.data.sinks.base import Scope

    sink.open(Scope("new", "write", 1), None)
    assert published_parts(str(out)) == old_set
    assert sorted(r["v"] for r in published_records(out)) == sorted(f"a{i}" for i in range(30))
    sink.close()
    # The first commit (the step parks right after it) switches the set at once.
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=0, every=1), src, ident, JsonlSink(out, mode="overwrite"))
    first = published_parts(str(out))
    assert first and set(first) == set(files_of(out, "new"))
    assert files_of(out, "old") == []  # the old parts are gone from disk
    got = published_records(out)
    assert got and all(r["v"].startswith("b") for r in got)
    run_map(run.attempt(), src, ident, JsonlSink(out, mode="overwrite"))
    assert sorted(r["v"] for r in published_records(out)) == sorted(f"b{i}" for i in range(40))
    # The replaced run can never write there again, even asking for overwrite.
    for mode in ("new", "overwrite", "append"):
        with pytest.raises(SinkOwnedError, match=r"run 'old' \(step 'write'\) in .* was replaced by "
                                                 r"run 'new'"):
            run_file("old", out, 5, "z", mode=mode)


def test_a_step_starting_without_state_discards_what_it_published_before(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Checkpoints at other moments than the second start's: other part names.
    run_file("r", out, 30, "a", rng=random.Random(7), every=4)
    assert len(files_of(out, "r")) > 0
    # The same run and step starting over (what --restart-step does): no duplicates.
    run_file("r", out, 30, "a")
    assert sorted(r["k"] for r in published_records(out)) == list(range(30))
    assert sorted(r["k"] for r in read_jsonl_dir(out)) == list(range(30))


def test_verify_snapshot_counts_only_the_published_set(tmp_path: Path) -> None:
    work = tmp_path / "work"
    out = work / "out"
    run_file("old", out, 10, "a")
    run_file("verify", out, 7, "b", mode="overwrite")
    # A part of a replaced run left behind (a crash before the delete, or by hand).
    (out / f"part-{tag_of('old', 'write')}-00000.0000-00000099.jsonl").write_text('{"k": 99, "v": "zz"}\n')
    counts = snapshot_files(work)["out/*.jsonl"]
    assert sum(counts.values()) == 7
    assert all(json.loads(r)["v"].startswith("b") for r in counts)


# -- SQL ------------------------------------------------------------------------------------------

def _db(tmp_path: Path) -> str:
    path = tmp_path / "out.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE IF NOT EXISTS results (k INTEGER, v TEXT)")
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty ``results`` table in SQLite, or in the session's PostgreSQL (a real server)."""
    if request.param == "sqlite":
        return _db(tmp_path)
    import psycopg

    url: str = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as c:
        for table in ("results", "segue_staged_results", "segue_sink_ledger", "segue_sink_owner"):
            c.execute(f"DROP TABLE IF EXISTS {table}")
        c.execute("CREATE TABLE results (k BIGINT, v TEXT)")
    return url


def _rows(url: str) -> list[tuple]:
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as c:
            return sorted(tuple(r) for r in c.execute("SELECT k, v FROM results").fetchall())
    with sqlite3.connect(url[len("sqlite:///"):]) as c:
        return sorted(c.execute("SELECT k, v FROM results").fetchall())


def run_sql(run_id: str, url: str, n: int, tag: str, mode: str = "transactional",
            **attempt: object) -> FakeRun:
    run = FakeRun(run_id, "write")
    run_map(run.attempt(**attempt), SequenceSource(recs(n, tag), shards=2), ident,
            SqlSink(url, "results", ["k", "v"], mode=mode))
    return run


def test_sql_table_owned_by_another_run_is_refused(sql_url: str) -> None:
    url = sql_url
    run_sql("a", url, 20, "a")
    before = _rows(url)
    with pytest.raises(SinkOwnedError, match=r"^table results belongs to run 'a' \(step 'write'\); "
                                             r"write to another table, or pass mode='append'"):
        run_sql("b", url, 20, "b")
    assert _rows(url) == before


def test_sql_append_and_overwrite(sql_url: str) -> None:
    url = sql_url
    run_sql("a", url, 20, "a")
    run_sql("b", url, 10, "b", mode="append")
    assert len(_rows(url)) == 30
    run = FakeRun("c", "write")
    src = SequenceSource(recs(15, "c"), shards=3)
    with pytest.raises(Park):  # first commit, then park
        run_map(run.attempt(pause_after=0), src, ident, SqlSink(url, "results", ["k", "v"], mode="overwrite"))
    rows = _rows(url)
    assert rows and all(v.startswith("c") for _, v in rows)  # old rows left in the same transaction
    run_map(run.attempt(), src, ident, SqlSink(url, "results", ["k", "v"], mode="overwrite"))
    assert _rows(url) == sorted((i, f"c{i}") for i in range(15))
    with pytest.raises(SinkOwnedError, match=r"rows of run 'a' \(step 'write'\) were replaced by run 'c'"):
        run_sql("a", url, 5, "z", mode="append")


def test_sql_restart_takes_back_its_rows_only_when_they_are_all_its_own(sql_url: str) -> None:
    url = sql_url
    run_sql("a", url, 20, "a")
    run_sql("a", url, 20, "a")  # started again without state: its rows replaced, not duplicated
    assert _rows(url) == sorted((i, f"a{i}") for i in range(20))
    run_sql("b", url, 5, "b", mode="append")
    with pytest.raises(DataError, match=r"mixed with other runs' rows"):
        run_sql("b", url, 5, "b", mode="append")
    assert len(_rows(url)) == 25


def test_parallel_workers_share_the_ownership_and_a_restart_discards_every_worker_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    src = SequenceSource(recs(600, "a"), shards=5)
    for _ in range(2):  # the second start has no state: the first one's parts must go
        run_map(FakeRun("par", "write").attempt(), src, ident, JsonlSink(out), read_batch=50, workers=2,
                allow_pickle=True)
        assert sorted(r["k"] for r in read_jsonl_dir(out)) == list(range(600))
    assert any("-w1-" in n for n in published_parts(str(out)) or [])
    with pytest.raises(SinkOwnedError, match=r"belongs to run 'par' \(step 'write'\)"):
        run_map(FakeRun("other", "write").attempt(), src, ident, JsonlSink(out), read_batch=50, workers=2,
                allow_pickle=True)


def test_preflight_refuses_what_open_would_and_writes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    SqlSink(f"sqlite:///{missing}", "results", ["k", "v"]).preflight("b", "write")
    assert not missing.exists()  # a check never creates the database
    url = _db(tmp_path)
    run_sql("a", url, 10, "a")
    SqlSink(url, "results", ["k", "v"]).preflight("a", "write")  # the owner itself: fine
    SqlSink(url, "results", ["k", "v"], mode="append").preflight("b", "write")
    with pytest.raises(SinkOwnedError, match=r"^table results belongs to run 'a'"):
        SqlSink(url, "results", ["k", "v"]).preflight("b", "write")
    out = tmp_path / "out"
    run_file("a", out, 10, "a")
    marker = (out / ".segue-owner.json").read_bytes()
    with pytest.raises(SinkOwnedError, match=r"belongs to run 'a'"):
        JsonlSink(out).preflight("b", "write")
    assert (out / ".segue-owner.json").read_bytes() == marker
    JsonlSink(tmp_path / "fresh").preflight("b", "write")
    assert not (tmp_path / "fresh").exists()
