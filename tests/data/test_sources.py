"""Sources: every record read exactly once across shards, positions, restores and splits."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segue.data import CsvSource, JsonlSource, ParquetSource, SequenceSource, SqlSource
from segue.data.sources.base import BadRecord, Shard, Source

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def drain(shard: Shard, position: dict[str, Any], batch: int) -> list[Any]:
    return [r for b in shard.read(position, batch) for r in b.records]


def read_with_restarts(source: Source, data: st.DataObject, batch: int) -> list[Any]:
    """Read every shard, stopping at random points: round-trip the position through JSON,
    then either resume from it or split the rest in two and read both halves."""
    out: list[Any] = []
    snap = json.loads(json.dumps(source.snapshot()))
    for shard in source.shards(snap):
        shard = source.shard_from_json(json.loads(json.dumps(shard.to_json())))
        pos = shard.start()
        while True:
            stop_after = data.draw(st.integers(0, 3))
            it = shard.read(pos, batch)
            ended = True
            for k, b in enumerate(it):
                out.extend(b.records)
                pos = b.position
                if k + 1 >= stop_after:
                    ended = False
                    break
            if ended:
                break
            pos = json.loads(json.dumps(pos))
            if data.draw(st.booleans()):
                halves = shard.split(pos)
                if halves is not None:
                    left, right = halves
                    out.extend(drain(left, left.start(), batch))
                    out.extend(drain(right, right.start(), batch))
                    break
    return out


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
records = st.lists(st.fixed_dictionaries({"i": st.integers(), "s": texts}), max_size=60)


@SETTINGS
@given(recs=records, shard_bytes=st.integers(1, 400), batch=st.integers(1, 7), data=st.data())
def test_jsonl_round_trip(tmp_path: Path, recs: list[Any], shard_bytes: int, batch: int, data: st.DataObject) -> None:
    for f in tmp_path.glob("*.jsonl"):
        f.unlink()
    half = len(recs) // 2
    for name, part in (("a", recs[:half]), ("b", recs[half:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part))
    src = JsonlSource(str(tmp_path / "*.jsonl"), shard_bytes=shard_bytes)
    assert read_with_restarts(src, data, batch) == recs


@SETTINGS
@given(rows=st.lists(st.tuples(st.integers(), st.text(alphabet="ab,\"\n\r x", max_size=8)), max_size=40),
       batch=st.integers(1, 5), data=st.data())
def test_csv_round_trip_with_quoted_newlines(tmp_path: Path, rows: list[tuple[int, str]], batch: int,
                                             data: st.DataObject) -> None:
    path = tmp_path / "in.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "text"])
        w.writerows(rows)
    got = read_with_restarts(CsvSource(str(path)), data, batch)
    assert got == [{"n": str(n), "text": t} for n, t in rows]


@SETTINGS
@given(n=st.integers(0, 300), shards=st.integers(1, 5), batch=st.integers(1, 50), data=st.data())
def test_sequence_round_trip(n: int, shards: int, batch: int, data: st.DataObject) -> None:
    assert read_with_restarts(SequenceSource(list(range(n)), shards=shards), data, batch) == list(range(n))


@SETTINGS
@given(n=st.integers(0, 250), rg=st.integers(1, 40), shard_rows=st.integers(1, 100), batch=st.integers(1, 30),
       data=st.data())
def test_parquet_round_trip(tmp_path: Path, n: int, rg: int, shard_rows: int, batch: int, data: st.DataObject) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"i": list(range(n)), "s": [f"r{i}" for i in range(n)]}), tmp_path / "t.parquet",
                   row_group_size=rg)
    got = read_with_restarts(ParquetSource(str(tmp_path / "t.parquet"), shard_rows=shard_rows), data, batch)
    assert got == [{"i": i, "s": f"r{i}"} for i in range(n)]


@SETTINGS
@given(keys=st.sets(st.integers(-1000, 1000), max_size=80), shards=st.integers(1, 4), batch=st.integers(1, 20),
       data=st.data())
def test_sqlite_keyset_round_trip(tmp_path: Path, keys: set[int], shards: int, batch: int, data: st.DataObject) -> None:
    db = tmp_path / "src.db"
    db.unlink(missing_ok=True)
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        c.executemany("INSERT INTO t VALUES (?, ?)", [(k, f"v{k}") for k in keys])
    src = SqlSource(f"sqlite:///{db}", "t", key="id", shards=shards, page_size=7)
    got = read_with_restarts(src, data, batch)
    assert got == [{"id": k, "v": f"v{k}"} for k in sorted(keys)]


def test_sql_query_and_pinning(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        c.executemany("INSERT INTO t VALUES (?, ?)", [(k, "x" if k % 2 else "y") for k in range(10)])
    src = SqlSource(f"sqlite:///{db}", "SELECT id, v FROM t WHERE v = 'x'", key="id")
    snap = src.snapshot()
    assert snap["items"] == {"query": {"rows": 5, "max_key": 9}}
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO t VALUES (11, 'x')")
    now = src.snapshot()
    assert src.pinned(snap, now, "pin") == snap
    grown = src.pinned(snap, now, "include-new")
    ids = [r["id"] for s in src.shards(grown) for r in drain(s, s.start(), 3)]
    assert ids == [1, 3, 5, 7, 9, 11]
    from segue.data import InputChangedError

    with pytest.raises(InputChangedError, match=r"^input of step 'x' changed since the run began \(query rows 5 -> 6"):
        src.pinned(snap, now, "fail", "x")


def test_fsspec_memory_filesystem() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/segue-test/b.jsonl", b'{"i": 2}\n{"i": 3}\n')
    fs.pipe("/segue-test/a.jsonl", b'{"i": 0}\n{"i": 1}\n')
    src = JsonlSource("memory:///segue-test/*.jsonl", shard_bytes=5)
    snap = src.snapshot()
    assert list(snap["items"]) == ["/segue-test/a.jsonl", "/segue-test/b.jsonl"]  # sorted by path
    got = [r for s in src.shards(snap) for r in drain(s, s.start(), 10)]
    assert got == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}]


def test_bad_json_line_becomes_bad_record(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n{oops\n\n{"a": 2}\n')
    src = JsonlSource(str(tmp_path / "x.jsonl"))
    (b,) = list(src.shards(src.snapshot())[0].read({"offset": 0, "records": 0}))
    assert b.has_bad and b.records[0] == {"a": 1} and isinstance(b.records[1], BadRecord)
    assert b.records[1].raw == "{oops" and b.records[2] == {"a": 2} and b.position["records"] == 3


def test_jsonl_bom_and_invalid_utf8_parse_as_json_does(tmp_path: Path) -> None:
    # Lines are decoded as UTF-8 before parsing (fast path); a line that is not plain
    # UTF-8 falls back to json's own byte handling: a BOM is accepted as json.loads
    # accepts it, and bytes that are no text become a bad record, not an exception.
    (tmp_path / "x.jsonl").write_bytes(b'\xef\xbb\xbf{"a": 1}\n{"a": "\xff"}\n{"a": "\xc3\xa9"}\n')
    src = JsonlSource(str(tmp_path / "x.jsonl"))
    (b,) = list(src.shards(src.snapshot())[0].read({"offset": 0, "records": 0}))
    assert b.has_bad and b.records[0] == {"a": 1} and isinstance(b.records[1], BadRecord)
    assert b.records[2] == {"a": "\u00e9"} and b.position["records"] == 3
    (tmp_path / "y.jsonl").write_bytes(b'{"a": "\xc3\xa9"}\n')
    src = JsonlSource(str(tmp_path / "y.jsonl"))
    (b,) = list(src.shards(src.snapshot())[0].read({"offset": 0, "records": 0}))
    assert not b.has_bad and b.records == [{"a": "\u00e9"}]


def test_shard_order_is_documented(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.jsonl", "c/d.jsonl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text('{"x": 1}\n' * 10)
    src = JsonlSource(str(tmp_path), shard_bytes=40)
    keys = [(s.path.rsplit("/", 2)[-2:], s.key, s.begin) for s in src.shards(src.snapshot())]
    assert [k[1] for k in keys] == ["00000.0000", "00000.0001", "00000.0002",
                                    "00001.0000", "00001.0001", "00001.0002",
                                    "00002.0000", "00002.0001", "00002.0002"]
    assert [k[0][-1] for k in keys[::3]] == ["a.jsonl", "b.jsonl", "d.jsonl"]


def test_local_files_list_what_fsspec_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local inputs are listed without importing fsspec (a worker's start-up); the
    paths and the snapshot attributes must be what fsspec's LocalFileSystem gives."""
    import os

    from fsspec.core import url_to_fs

    from segue.data.sources.files import LOCAL, file_attrs, list_files

    root = tmp_path / "in"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for rel in ("a.jsonl", "sub/b.jsonl", "sub/deeper/c.jsonl", ".hidden/d.jsonl", "_meta.jsonl"):
        (root / rel).write_text('{"x": 1}\n')
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "e.jsonl").write_text('{"x": 2}\n')
    monkeypatch.chdir(tmp_path)
    for url in ("in", str(root), f"file://{root}", "in/sub/b.jsonl", "in/**/*.jsonl", "in/*.jsonl"):
        fs, paths = list_files(url)
        assert fs is LOCAL
        ref_fs, ref_path = url_to_fs(url)
        if "*" in url:
            ref = sorted(p for p in ref_fs.glob(ref_path) if ref_fs.isfile(p))
        elif ref_fs.isdir(ref_path):
            ref = sorted(p for p in ref_fs.find(ref_path)
                         if not any(part.startswith((".", "_")) for part in p[len(ref_path):].split("/")))
        else:
            ref = [ref_path]
        assert paths == ref, url
        assert [file_attrs(fs, p) for p in paths] == [file_attrs(ref_fs, p) for p in ref]
    # A symlinked folder is followed (fsspec's find lists the link itself, which no
    # reader can open as a file).
    os.symlink(tmp_path / "elsewhere", root / "linked")
    assert str(root / "linked" / "e.jsonl") in list_files("in")[1]
    with pytest.raises(FileNotFoundError):
        file_attrs(LOCAL, str(root / "missing.jsonl"))
