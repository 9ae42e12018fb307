"""The run page says where a split data step is among its shards, truthfully.

The positions come from the real coordinator over real sub-worker processes
(a lagging shard is split for the idle sub-worker, as in test_parallel); each
is committed to a real SQLite store and the page rendered by the real app.
A parallel position's ``shard_index`` is the shard count (past the last
shard), which the page drew as "shard 3/2".
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
from fakectx import FakeRun  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from segue_helpers import FLOWS  # noqa: E402

from segue.client.local import LocalClient  # noqa: E402
from segue.data import JsonlSink, SequenceSource, run_map  # noqa: E402
from segue.home import Home  # noqa: E402
from segue.server import create_app  # noqa: E402
from segue.states import Actor  # noqa: E402

N = 3000


def slow_low(r: int) -> dict[str, int]:
    if r < N // 2:
        time.sleep(0.0005)  # the first shard lags: the other sub-worker goes idle early
    return {"k": r, "v": 2 * r}


def _row(html: str, step: str) -> str:
    start = html.index(f'<tr id="step-{step}"')
    return html[start:html.index("</tr>", start)]


def test_a_split_step_shows_shards_done_of_the_pieces_its_splits_made(tmp_path: Path,
                                                                      _test_pool: Path) -> None:
    run = FakeRun()
    run_map(run.attempt(), SequenceSource(list(range(N)), shards=2), slow_low, JsonlSink(tmp_path / "out"),
            read_batch=50, workers=2, min_split=100, allow_pickle=True)
    last: dict[str, Any] = run.positions[-1]
    assert last["splits"] >= 1 and last["shard_index"] == last["shards"] == 2, last
    mid = next(p for p in run.positions if p["splits"] >= 1 and any(s["shard"] for s in p["slots"]))

    home = Home.resolve(tmp_path / "home")
    home.ensure()
    lc = LocalClient(home, pool=_test_pool, actor="cli")
    lc.prepare(str(FLOWS / "counter.py"), {"n": 5}, run_id="split1")
    store = lc.store
    epoch = store.start_attempt("split1", "count", ttl_s=60, actor=Actor.CONTROLLER).epoch
    with TestClient(create_app(home, pool=_test_pool, auth=False), base_url="http://127.0.0.1:8765") as c:
        pieces = 2 + mid["splits"]
        running = sum(1 for s in mid["slots"] if s["shard"])
        store.commit_checkpoint("split1", "count", epoch, seq=1, path="count/1", position=mid, nbytes=1)
        row = _row(c.get("/runs/split1").text, "count")
        want = (f"{pieces - mid['queued'] - running}/{pieces} shards done (2 + {mid['splits']} split), "
                f"{running} running")
        assert want in row, row
        store.commit_checkpoint("split1", "count", epoch, seq=2, path="count/2", position=last, nbytes=1)
        row = _row(c.get("/runs/split1").text, "count")
        pieces = 2 + last["splits"]
        assert f"{pieces}/{pieces} shards done (2 + {last['splits']} split)" in row, row
        # Never a shard past the last one.
        for m in re.finditer(r"shard (\d+)/(\d+)", row):
            assert int(m.group(1)) <= int(m.group(2)), row
