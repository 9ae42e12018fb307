"""Pool configuration is a mutation too: each change is recorded in the host pool with its
principal, through a real `segue server` process and the real CLI on one pool file.

An admin's `PUT /api/pool` is recorded as ``api:NAME``, `segue pool set` as ``cli``;
a viewer's or an operator's PUT is refused (403) and records nothing; a PUT from a
foreign origin neither. Every reader (the API, the pool page) shows the same rows.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
from segue_helpers import Segue  # noqa: E402
from serverkit import ServerProcess  # noqa: E402

from segue.store.hostpool import SQLiteHostPool  # noqa: E402

GB = 2**30


def _changes(srv: ServerProcess, token: str, **params: Any) -> list[dict[str, Any]]:
    with srv.client(token) as c:
        r = c.get("/api/pool/changes", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_pool_changes_name_their_principal(tmp_path: Path, _test_pool: Path, segue: Segue) -> None:
    with ServerProcess(home=tmp_path / "home", pool=_test_pool, logs=tmp_path) as srv:
        alice = srv.create_token("alice", "admin")
        viewer, op = srv.create_token("vera", "viewer"), srv.create_token("otto", "operator")
        assert _changes(srv, viewer) == []  # nothing configured yet

        with srv.client(alice) as c:
            r = c.put("/api/pool", json={"gpus": 3, "gpu_memory": "40GiB", "cpus": 6}, headers={"Origin": srv.url})
        assert r.status_code == 200, r.text
        assert len(r.json()["devices"]) == 3
        [first] = _changes(srv, viewer)
        assert first["actor"] == "api:alice"
        # Before: what the server found when it first read the pool (detected devices, or none).
        assert first["change"]["before"]["source"] != "configured"
        after = first["change"]["after"]
        assert (after["gpus"], after["gpu_memory"], after["cpus"], after["source"]) == (3, [40 * GB], 6.0,
                                                                                        "configured")

        # Refused requests write nothing: wrong roles, and an admin from a foreign origin.
        body = {"gpus": 7}
        for token, origin in ((viewer, srv.url), (op, srv.url), (alice, "https://evil.example")):
            with srv.client(token) as c:
                r = c.put("/api/pool", json=body, headers={"Origin": origin})
            assert r.status_code == 403, (r.status_code, r.text)
        assert _changes(srv, viewer) == [first]
        assert len(SQLiteHostPool(_test_pool).get_host(first["host"]).devices) == 3  # type: ignore[union-attr]

        # The command line names itself as it does in run events.
        proc = segue("pool", "set", "--gpus", "1", "--cpus", "6", "--gpu-mem", "40GiB")
        assert proc.returncode == 0, proc.stderr
        latest, older = _changes(srv, viewer)
        assert older == first and latest["actor"] == "cli" and latest["id"] > first["id"]
        assert latest["user"] and latest["host"] == first["host"]
        assert (latest["change"]["before"]["gpus"], latest["change"]["after"]["gpus"]) == (3, 1)
        assert _changes(srv, viewer, limit=1) == [latest]
        # Detection replacing configured devices is a change as well (whatever it finds here).
        proc = segue("pool", "detect", "--replace")
        assert proc.returncode == 0, proc.stderr
        detected = _changes(srv, viewer, limit=1)[0]
        with srv.client(viewer) as c:
            source = c.get("/api/pool").json()["source"]
        assert detected["actor"] == "cli" and detected["change"]["before"] == latest["change"]["after"]
        assert detected["change"]["after"]["source"] == source != "configured"
        proc = segue("pool", "set", "--gpus", "1", "--cpus", "6", "--gpu-mem", "40GiB")
        assert proc.returncode == 0, proc.stderr
        latest = _changes(srv, viewer, limit=1)[0]
        with srv.client(viewer) as c:
            assert c.get("/api/pool/changes", params={"limit": 0}).status_code == 422
            assert c.get("/api/pool/changes", params={"limit": 1001}).status_code == 422

        # The pool page lists them all, newest first, with who made them and what changed.
        with srv.client(viewer) as c:
            page = c.get("/pool")
        assert page.status_code == 200, page.text
        text = html.unescape(page.text)
        table = text.split('<table class="pool-changes">', 1)[1].split("</table>", 1)[0]
        rows = table.split("<tr>")[2:]  # after the header's
        assert len(rows) == 4
        assert all('<td class="actor">cli</td>' in r for r in rows[:3])
        assert "gpus 3 → 1" in rows[2] and f"source configured → {source}" in rows[1]
        assert '<td class="actor">api:alice</td>' in rows[3] and "→ 3" in rows[3] and "→ 40.0 GiB" in rows[3]


def test_pool_changes_need_a_token(tmp_path: Path, _test_pool: Path) -> None:
    with ServerProcess(home=tmp_path / "home", pool=_test_pool, logs=tmp_path) as srv:
        with srv.client(srv.token) as c:
            assert c.get("/api/pool/changes").json() == []
            r = c.put("/api/pool", json={"gpus": 2}, headers={"Origin": srv.url})
            assert r.status_code == 200, r.text
            [change] = c.get("/api/pool/changes").json()
        assert change["actor"] == "api:admin"  # the bootstrap token's name
        import httpx

        assert httpx.get(srv.url + "/api/pool/changes").status_code == 401
        assert httpx.put(srv.url + "/api/pool", json={"gpus": 5}, headers={"Origin": srv.url}).status_code == 401
        with srv.client(srv.token) as c:
            assert c.get("/api/pool/changes").json() == [change]
