"""The name this process's host goes by in the store and the device pool.

``$SEGUE_HOST_ID`` (the user's setting) overrides the machine's hostname, and an
entry point told a name explicitly overrides both (:func:`use_host`): ``segue
agent --host-id B`` names the host B, and hands the name to every controller it
starts (``--host``), which hands it to its workers in their options record. So
several hosts can be told apart on one machine (the cluster tests do so), and a
container whose hostname changes at every start keeps its name. Everything that
compares "the same host" (is a controller's pid ours to check, is a worker's
lease ours to reclaim, which pool rows are ours) must use this, never
``socket.gethostname()`` directly.

The name is a process-wide value on purpose (a process runs on one host), set
only by entry points (the agent command, the controller and worker mains);
never exported to the environment.
"""

from __future__ import annotations

import os
import socket

ENV = "SEGUE_HOST_ID"

_given: str | None = None  # set by an entry point from its command line or options record


def use_host(name: str | None) -> None:
    """This process's host name from now on (an entry point's explicit one; None: none)."""
    global _given
    _given = name or None


def given_host() -> str | None:
    """The name given explicitly (:func:`use_host`, else ``$SEGUE_HOST_ID``), or None for
    the hostname: what a process on another machine must be told (a Ray node keeps its
    own hostname unless a name was given)."""
    return _given or os.environ.get(ENV) or None


def this_host() -> str:
    return given_host() or socket.gethostname()
