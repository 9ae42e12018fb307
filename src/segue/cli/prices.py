"""`segue prices [set KEY USD | unset KEY]`: what devices and storage cost, per hour or GB-month."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ..errors import UsageError
from ..home import Home
from ..placement.pricing import (
    CATALOG,
    DEFAULTS,
    Prices,
    check_price,
    load_overrides,
    save_overrides,
)
from .render import print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("prices", help="prices per device type (USD per hour) used by `segue status`")
    p.add_argument("--json", action="store_true")
    psub = p.add_subparsers(dest="prices_cmd")
    s = psub.add_parser("set", help="set the price of a device type, cpu (core-hour) or storage (GB-month)")
    s.add_argument("key", help="a catalog key (see `segue prices`) or a device slug")
    s.add_argument("usd", help="US dollars per unit")
    u = psub.add_parser("unset", help="go back to the default price")
    u.add_argument("key")


def _usd(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"price {text!r} is not a number of US dollars") from None
    if not math.isfinite(v):
        raise UsageError(f"price {text!r} must be finite")
    return v


def cmd_prices(a: argparse.Namespace, home: Home) -> int:
    own = load_overrides(home.root)
    if a.prices_cmd == "set":
        key, usd = check_price(a.key, _usd(a.usd))
        home.ensure()
        save_overrides(home.root, {**own, key: usd})
    elif a.prices_cmd == "unset":
        if a.key not in own:
            raise UsageError(f"no price of your own is set for {a.key!r}; "
                             f"set ones: {', '.join(sorted(own)) or 'none'}")
        own.pop(a.key)
        save_overrides(home.root, own)
    prices = Prices.resolve(home.root)
    units = {e.key: (e.label, e.unit) for e in CATALOG}
    rows = [{"key": k, "usd": v, "unit": units.get(k, ("", "device-hour"))[1],
             "label": units.get(k, (k, ""))[0], "default": DEFAULTS.get(k),
             "set_here": k in own} for k, v in prices.usd.items()]
    if a.json:
        print_json(rows)
        return 0
    for r in rows:
        mark = "  (set)" if r["set_here"] else ""
        print(f"{r['key']:<24} {r['usd']:>8.4g} USD/{r['unit']:<12} {r['label']}{mark}")
    return 0
