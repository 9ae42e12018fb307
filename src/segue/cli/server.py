"""`segue server` and `segue token`: the HTTP control plane and its access tokens."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Any

from ..client.local import LocalClient
from ..errors import UsageError
from .render import print_json

DEFAULT_PORT = 8765


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("server", help="serve the HTTP API and the web UI (needs segue[server])")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--no-auth", action="store_true",
                   help="serve without tokens (refused unless the address is loopback)")
    s.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                   help="another origin whose pages may call the API (repeat for several)")
    t = sub.add_parser("token", help="create, list or revoke the server's access tokens")
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    c = tsub.add_parser("create", help="create a token; it is printed once")
    c.add_argument("name")
    c.add_argument("--role", default="viewer", help="viewer (read), operator (steer runs) or admin")
    c.add_argument("--may-pause", default=None, metavar="CLASSES",
                   help="priority classes whose runs it may pause and cancel, e.g. batch,normal (default all)")
    c.add_argument("--may-resume", default=None, metavar="CLASSES",
                   help="priority classes whose runs it may resume and submit (default all)")
    tsub.add_parser("list", help="the tokens (names and roles; never the tokens)").add_argument(
        "--json", action="store_true")
    r = tsub.add_parser("revoke", help="revoke a token by name")
    r.add_argument("name")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_server(a: argparse.Namespace, client: LocalClient) -> int:
    if not 0 < a.port < 65536:
        raise UsageError(f"--port must be 1-65535, not {a.port}")
    if a.no_auth and not is_loopback(a.host):
        raise UsageError(f"refusing to serve {a.host} without tokens: anyone who can reach it could "
                         f"steer runs; drop --no-auth, or bind 127.0.0.1")
    try:
        import uvicorn

        from ..server import create_app
    except ImportError as exc:
        raise UsageError(f"segue server needs the server extra ({exc.name} is missing): "
                         f"pip install 'segue[server]'") from None
    from ..server.auth import TokenStore

    client.home.ensure()
    if not a.no_auth:
        first = TokenStore(client.home).bootstrap()
        if first is not None:
            print(f"admin token (shown once, stored hashed in {client.home.root}/tokens.json):\n{first}",
                  file=sys.stderr, flush=True)
    app = create_app(client.home, pool=client.pool_path, auth=not a.no_auth,
                     allowed_origins=tuple(a.allow_origin))
    print(f"segue server on http://{a.host}:{a.port}/ (home {client.home.root})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)
    return 0


def cmd_token(a: argparse.Namespace, client: LocalClient) -> int:
    from ..server.auth import Role, TokenStore, parse_classes

    store = TokenStore(client.home)
    if a.token_cmd == "create":
        role = Role.parse(a.role)
        token = store.create(a.name, role, may_pause=parse_classes(a.may_pause),
                             may_resume=parse_classes(a.may_resume), actor=client.actor)
        print(token)
        print(f"token {a.name!r} ({role.name.lower()}) created; it is shown only now", file=sys.stderr)
    elif a.token_cmd == "revoke":
        store.revoke(a.name, actor=client.actor)
        print(f"token {a.name!r} revoked")
    else:
        rows = [p.to_json() for p in store.list()]
        if a.json:
            print_json(rows)
            return 0
        for r in rows:
            print(f"{r['name']:<20} {r['role']:<9} may pause {','.join(r['may_pause'])}  "
                  f"may resume {','.join(r['may_resume'])}")
    return 0
