"""The name this process's host goes by in the store and the device pool.

``$SEGUE_HOST_ID`` overrides the machine's hostname: an agent started with
``segue agent --host-id B`` exports it to every controller and worker it
starts, so several hosts can be told apart on one machine (the cluster
tests do so), and a container whose hostname changes at every start keeps
its name. Everything that compares "the same host" (is a controller's pid
ours to check, is a worker's lease ours to reclaim, which pool rows are
ours) must use this, never ``socket.gethostname()`` directly.
"""

from __future__ import annotations

import os
import socket

ENV = "SEGUE_HOST_ID"


def this_host() -> str:
    return os.environ.get(ENV) or socket.gethostname()
