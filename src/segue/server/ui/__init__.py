"""The web UI of `segue server`: server-rendered pages over the same client as the API.

Importing this package registers the UI with :func:`segue.server.create_app`
(``segue.server.app._EXTENSIONS``). Modules: ``routes`` (HTTP, login, static
files), ``listing`` (the runs page), ``views`` (the run page), ``poolview`` (the pool page),
``history`` (attempts, gaps and interruptions read from events), ``dag`` (the
step graph), ``charts`` (SVG geometry). Templates are Jinja2 with
autoescaping on; the only script is ``static/segue.js``.
"""

from __future__ import annotations

from ..app import _EXTENSIONS
from .routes import register

if register not in _EXTENSIONS:
    _EXTENSIONS.append(register)

__all__ = ["register"]
