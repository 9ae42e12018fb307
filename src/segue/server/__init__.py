"""`segue server`: the HTTP API, the web UI and /metrics over one home (extra: segue[server]).

Layering: ``server`` sits on ``client`` (the library API), like the CLI. The
API is in :mod:`.app`, access rules in :mod:`.auth` and :mod:`.security`.
"""

from __future__ import annotations

from . import metrics as _metrics  # noqa: F401  registers GET /metrics
from . import schedules as _schedules  # noqa: F401  the server fires the home's schedules
from . import webhooks as _webhooks  # noqa: F401  the server pumps the home's webhooks
from .app import create_app

try:  # the web UI registers itself with create_app; without jinja2 the API still serves
    from . import ui as _ui  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "jinja2":
        raise

__all__ = ["create_app"]
