"""Tokens are managed by admins through the API as well as by `segue token` on the host,
through a real `segue server` process.

A token an admin creates through the API works at once and is shown only in that
answer; a revoked one is refused at once; the tokens file names who created and
who revoked each; only admins may list, create or revoke, and only from the
server's own origin; the last admin token cannot be revoked through the API;
bad bodies are 422 or 400 and change nothing.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
from serverkit import ServerProcess  # noqa: E402


def _tokens_file(srv: ServerProcess) -> list[dict[str, Any]]:
    return json.loads((srv.home / "tokens.json").read_text())["tokens"]


def test_admins_create_and_revoke_tokens_through_the_api(tmp_path: Path, _test_pool: Path) -> None:
    with ServerProcess(home=tmp_path / "home", pool=_test_pool, logs=tmp_path) as srv:
        alice = srv.create_token("alice", "admin")  # by the CLI: recorded as such
        viewer, op = srv.create_token("vera", "viewer"), srv.create_token("otto", "operator")
        own = {"Origin": srv.url}
        with srv.client(alice) as c:
            r = c.post("/api/tokens", json={"name": "ci", "role": "operator", "may_pause": ["batch"],
                                            "may_resume": ["batch", "normal"]}, headers=own)
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["name"] == "ci" and made["role"] == "operator" and made["token"].startswith("sgt_")
        assert r.headers["cache-control"] == "no-store"
        with srv.client(made["token"]) as c:  # it works at once, with what was asked
            who = c.get("/api/whoami").json()
        assert who == {"name": "ci", "role": "operator", "may_pause": ["batch"],
                       "may_resume": ["normal", "batch"]}  # in priority order

        with srv.client(alice) as c:
            listed = c.get("/api/tokens").json()
        assert {t["name"]: t["created_by"] for t in listed} == {
            "admin": None, "alice": "cli", "vera": "cli", "otto": "cli", "ci": "api:alice"}
        assert all("sha256" not in t and "token" not in t for t in listed)  # never a secret
        assert made["token"] not in (srv.home / "tokens.json").read_text()  # stored as a digest
        assert stat.S_IMODE((srv.home / "tokens.json").stat().st_mode) == 0o600

        with srv.client(alice) as c:
            r = c.delete("/api/tokens/ci", headers=own)
        assert r.status_code == 200 and r.json() == {"name": "ci", "revoked_by": "api:alice"}
        with srv.client(made["token"]) as c:
            assert c.get("/api/whoami").status_code == 401  # refused at once
        with srv.client(alice) as c:
            assert "ci" not in {t["name"] for t in c.get("/api/tokens").json()}
            gone = [t for t in c.get("/api/tokens", params={"revoked": "true"}).json() if t["name"] == "ci"]
        assert len(gone) == 1 and gone[0]["revoked_by"] == "api:alice" and gone[0]["revoked_at"] > 0
        # The name is free again: a new token of that name is a new secret.
        with srv.client(alice) as c:
            again = c.post("/api/tokens", json={"name": "ci", "role": "viewer"}, headers=own).json()["token"]
        assert again != made["token"]

        before = (srv.home / "tokens.json").read_bytes()
        # Only admins, only from the server's origin; nothing changes on a refusal.
        for token in (viewer, op):
            with srv.client(token) as c:
                assert c.get("/api/tokens").status_code == 403
                assert c.post("/api/tokens", json={"name": "x", "role": "admin"}, headers=own).status_code == 403
                assert c.delete("/api/tokens/alice", headers=own).status_code == 403
        with srv.client(alice) as c:
            assert c.post("/api/tokens", json={"name": "x", "role": "admin"},
                          headers={"Origin": "https://evil.example"}).status_code == 403
            assert c.delete("/api/tokens/vera", headers={"Origin": "https://evil.example"}).status_code == 403
            # Bad input: one line naming what is wrong, nothing written.
            bad = [({"name": "x", "role": "root"}, 422), ({"name": "x"}, 422),
                   ({"name": "x y", "role": "viewer"}, 400), ({"name": "vera", "role": "viewer"}, 400),
                   ({"name": "x", "role": "operator", "may_pause": ["nightly"]}, 400),
                   ({"name": "x", "role": "viewer", "extra": 1}, 422)]
            for body, code in bad:
                r = c.post("/api/tokens", json=body, headers=own)
                assert r.status_code == code, (body, r.status_code, r.text)
                assert "\n" not in r.json()["error"]
            r = c.delete("/api/tokens/nobody", headers=own)
            assert r.status_code == 404 and "no token named 'nobody'" in r.json()["error"]
        assert (srv.home / "tokens.json").read_bytes() == before


def test_the_last_admin_token_cannot_be_revoked_through_the_api(tmp_path: Path, _test_pool: Path) -> None:
    with ServerProcess(home=tmp_path / "home", pool=_test_pool, logs=tmp_path) as srv:
        own = {"Origin": srv.url}
        with srv.client() as c:  # the bootstrap admin token, the only admin
            r = c.delete("/api/tokens/admin", headers=own)
            assert r.status_code == 400, r.text
            assert r.json()["error"].startswith("token 'admin' is the last admin token; create another")
            second = c.post("/api/tokens", json={"name": "root2", "role": "admin"}, headers=own).json()["token"]
            assert c.delete("/api/tokens/admin", headers=own).status_code == 200  # now it may go
            assert c.get("/api/whoami").status_code == 401  # it was this very token
        with srv.client(second) as c:
            assert c.get("/api/whoami").json()["name"] == "root2"
            assert c.delete("/api/tokens/root2", headers=own).status_code == 400  # the last one again
        revoked = [t for t in _tokens_file(srv) if t["name"] == "admin"]
        assert revoked[0]["revoked_by"] == "api:admin"
