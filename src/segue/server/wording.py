"""The API's wording of an error the layers below wrote for the command line.

The client, the run and the flow layers word their refusals for `segue`'s
commands ("pass --param n=<int>", "`segue resume RUN`"); the CLI prints
them as they are. An API caller sends JSON fields and requests instead, so
:func:`api_message` rewrites each CLI phrase to the field or the request that
does the same, at the API boundary only. A phrase with no API equivalent
(`segue token revoke NAME` on the host, a server flag) is left as it is.
"""

from __future__ import annotations

import re

_ARG = r"([^\s`;,()]+)"  # a value inside a phrase: up to a space, a backquote or punctuation

# The JSON field of each flag a message may name.
_FIELDS = {"run-id": "run_id", "checkpoints": "checkpoints", "restart-step": "restart_step",
           "on-input-change": "on_input_change", "allow-code-change": "allow_code_change",
           "on-env-change": "on_env_change",
           "priority": "priority", "gpus": "gpus", "gpu-mem": "gpu_memory", "max-pause": "max_pause"}

# (pattern, replacement), applied in order: the longer phrases first.
_REWRITES: list[tuple[re.Pattern[str], str]] = [(re.compile(p), r) for p, r in [
    (rf"`segue resume {_ARG} --restart-step {_ARG}`", r'POST /api/runs/\1/resume with {"restart_step": "\2"}'),
    (rf"`segue resume {_ARG}`", r"POST /api/runs/\1/resume"),
    (r"`segue resume`", "POST /api/runs/RUN/resume"),
    (rf"`segue status {_ARG}`", r"GET /api/runs/\1"),
    (r"`segue status`", "GET /api/runs/RUN"),
    (r"`segue ls`", "GET /api/runs"),
    (rf"`segue logs {_ARG} {_ARG}`", r"GET /api/runs/\1/logs?step=\2"),
    (rf"`segue events {_ARG}`", r"GET /api/runs/\1/events"),
    (r"`segue token list`", "GET /api/tokens"),
    (rf"`segue token revoke {_ARG}`(?! on the host)", r"DELETE /api/tokens/\1"),
    (r"`segue pool set --gpus N`", 'PUT /api/pool with {"gpus": N}'),
    (rf"--param {_ARG}=<(\w+)>", r'"params": {"\1": <\2>}'),
    (rf"--param {_ARG}={_ARG}", r'"params": {"\1": \2}'),
    (r"--allow-code-change", '"allow_code_change": true'),
    (r"--checkpoints URL", '"checkpoints": URL'),
    (rf"`--on-input-change {_ARG}`", r'"on_input_change": "\1"'),
    (rf"`--restart-step {_ARG}`", r'"restart_step": "\1"'),
    (rf"--restart-step (?!only){_ARG}", r'"restart_step": "\1"'),
]]
_FLAG = re.compile(rf'"?--?({"|".join(_FIELDS)})\b"?')


def api_message(message: str) -> str:
    """``message`` with its CLI phrases in the API's terms (see the module doc)."""
    for pattern, replacement in _REWRITES:
        message = pattern.sub(replacement, message)
    # Last, every flag left, and the flags the phrases above quoted, by their JSON field.
    return _FLAG.sub(lambda m: f'"{_FIELDS[m.group(1)]}"', message)
