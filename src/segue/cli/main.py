"""`segue`: a thin command line over the library API.

Exit codes (each error class has one; the table is in segue.errors):

    0  the run succeeded, or the command did its job
    1  the run failed or was cancelled, or the command hit an operational
       error (store, checkpoint, data); one line on stderr says what
    2  bad usage or input, or a command the run refuses as it is (resume a
       succeeded run, a second controller): one line on stderr, nothing written
    3  the run ended paused
    4  conflict: the run changed under the command (another process moved it
       at the same moment), or the metadata store stayed busy (another process
       held its write lock past $SEGUE_STORE_BUSY_TIMEOUT_S, 30 s by default);
       nothing was half-written, check `segue status` and retry
  130  interrupted by ctrl-c outside a run (while loading a flow, say)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..client.local import LocalClient
from ..errors import SegueError, UsageError, WaitTimeoutError, exit_code
from ..executor.ray_lean import own_process
from ..flow import parse_duration, parse_overrides
from ..placement.policy import parse_priority
from ..placement.pricing import parse_price
from ..run.controller import Interrupts
from ..run.options import RunOptions
from ..states import Actor, RunState
from ..units import parse_bytes
from . import agent as agent_cmd
from . import bench_model as bench_model_cmd
from . import ckpt_run, sched, verify
from . import costs as costs_view
from . import env as env_cmd
from . import logs as logs_cmd
from . import metrics as metrics_cmd
from . import output as output_cmd
from . import plan as plan_cmd
from . import prices as prices_cmd
from . import schedule as schedule_cmd
from . import server as server_cmd
from . import webhook as webhook_cmd
from .render import RunDisplay, event_line, fmt_time, position_detail, print_json, progress_text

EXIT = {RunState.SUCCEEDED: 0, RunState.PAUSED: 3}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        raise UsageError(f"{message}; see `segue {' '.join(self.prog.split()[1:])} --help`" if " " in self.prog
                         else f"{message}; see `segue --help`")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="segue", description="Resumable runs for long batch and AI pipelines.")
    p.add_argument("--home", help="state directory (default $SEGUE_HOME or ./.segue)")
    p.add_argument("--pool", help="the host's device pool database, shared by every home "
                                  "(default $SEGUE_POOL, see README)")
    p.add_argument("--store", metavar="URL",
                   help="the home's metadata store: postgresql://USER@HOST[:PORT]/DB "
                        "(default $SEGUE_STORE, else HOME/config.json's \"store\", else SQLite "
                        "in HOME/segue.db)")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="start a run of FLOW.py")
    r.add_argument("flow", help="the flow file: a .py file that defines a segue.Flow")
    r.add_argument("--param", "-p", action="append", default=[], metavar="K=V",
                   help="set the flow parameter K to V, converted to its declared type "
                        "(repeat for several)")
    r.add_argument("--run-id", metavar="ID",
                   help="the run's id: 1-64 letters, digits, '.', '_' or '-' "
                        "(default: the flow's name, the date and time, a random suffix)")
    r.add_argument("--detach", action="store_true", help="run the controller in the background")
    r.add_argument("--pause-deadline", type=float, metavar="S",
                   help="seconds a task may take to park before it is killed (default 30)")
    r.add_argument("--pause-on-failure", action="store_true",
                   help="pause instead of failing when a step exhausts its retries")
    r.add_argument("--on-input-change", choices=("fail", "pin", "include-new"), default=None,
                   help="data steps: what to do when the input changed since the run began")
    r.add_argument("--on-env-change", choices=("fail", "warn", "allow"), default=None,
                   help="at resume: what to do when a distribution a step imported, or a variable "
                        "the flow declares (Flow(env=...)), changed since the run last ran "
                        "(default fail; stored with the run; see `segue env RUN`)")
    r.add_argument("--checkpoints", default=None, metavar="URL",
                   help="where the run keeps checkpoints and step outputs: an absolute path or "
                        "any fsspec URL such as s3://bucket/prefix (default $SEGUE_CHECKPOINTS, "
                        "else HOME/data)")
    r.add_argument("--executor", choices=("local", "ray"), default=None,
                   help="where attempts run: local processes (default $SEGUE_EXECUTOR, else local) "
                        "or actors on a Ray cluster (pip install 'segue[ray]')")
    r.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="the Ray cluster for --executor ray, e.g. 10.0.0.1:6379 "
                        "(default $SEGUE_RAY_ADDRESS, else $RAY_ADDRESS, else a local Ray)")
    r.add_argument("--priority", default=None,
                   help="urgent, high, normal (default) or batch, or an integer")
    r.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="GPUs for the steps that use GPUs (all steps if none declares any)")
    r.add_argument("--gpu-mem", default=None, metavar="SIZE", help="at least this much memory per GPU, e.g. 40GB (10^9 bytes) or 40GiB (2^30)")
    r.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None,
                   help="may be paused for higher-priority work (default: batch and normal yes)")
    r.add_argument("--max-pause", default=None, metavar="DURATION",
                   help="after this long paused by preemption, the run gains a priority class (aging)")

    ls = sub.add_parser("ls", help="list runs, newest first")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--state", action="append", default=None, metavar="STATE",
                    help="only runs in this state (repeat for several)")
    ls.add_argument("--flow", default=None, help="only runs of this flow")
    ls.add_argument("--limit", type=int, default=None, metavar="N", help="at most N runs")
    s = sub.add_parser("status", help="show a run")
    s.add_argument("run")
    s.add_argument("--json", action="store_true")
    s.add_argument("--items", action="store_true",
                   help="list every task of a fan-out or a loop (default: counts, and those not done)")
    s.add_argument("--price", action="append", default=[], metavar="KEY=USD",
                   help="price per hour for this display, e.g. h100=9.80 (see `segue prices`)")

    pa = sub.add_parser("pause", help="pause a run at its next pause points")
    pa.add_argument("run")
    pa.add_argument("--wait", action="store_true", help="block until the stored state is PAUSED")
    pa.add_argument("--timeout", type=float, default=None, metavar="S")

    rs = sub.add_parser("resume", help="continue a paused, failed or orphaned run")
    rs.add_argument("run", help="the id of the run to continue")
    rs.add_argument("--detach", action="store_true", help="run the controller in the background")
    rs.add_argument("--allow-code-change", action="store_true",
                    help="resume even though the flow file changed since the run began "
                         "(its checkpoints must still fit the new code)")
    rs.add_argument("--on-input-change", choices=("fail", "pin", "include-new"), default=None,
                    help="data steps: what to do when the input changed since the run began "
                         "(stored with the run)")
    rs.add_argument("--on-env-change", choices=("fail", "warn", "allow"), default=None,
                    help="resume even though a distribution a step imported, or a declared variable, "
                         "changed since the run last ran: warn says so, allow only records it "
                         "(stored with the run; `segue env RUN` shows the diff)")
    rs.add_argument("--restart-step", default=None, metavar="STEP",
                    help="start STEP over from scratch, discarding its checkpoints and the output "
                         "it published (needed when none of its checkpoints verifies)")

    sub.add_parser("cancel", help="cancel a run").add_argument("run")
    e = sub.add_parser("events", help="a run's state changes")
    e.add_argument("run")
    e.add_argument("--json", action="store_true")
    e.add_argument("--after", type=int, default=0, metavar="ID", help="only events after this id")
    e.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new events until the run finishes or pauses")
    c = sub.add_parser("checkpoints", help="a run's committed checkpoints")
    c.add_argument("run")
    c.add_argument("--json", action="store_true")
    sched.add_parsers(sub)
    verify.add_parser(sub)
    ckpt_run.add_parser(sub)
    output_cmd.add_parser(sub)
    env_cmd.add_parser(sub)
    logs_cmd.add_parser(sub)
    metrics_cmd.add_parser(sub)
    prices_cmd.add_parser(sub)
    plan_cmd.add_parser(sub)
    bench_model_cmd.add_parser(sub)
    server_cmd.add_parsers(sub)
    webhook_cmd.add_parsers(sub)
    agent_cmd.add_parsers(sub)
    schedule_cmd.add_parsers(sub)
    return p


def _foreground(client: LocalClient, run_id: str, reason: str, *, after: int = 0) -> int:
    interrupts = Interrupts()
    signal.signal(signal.SIGINT, lambda s, f: interrupts.hit(s))
    signal.signal(signal.SIGTERM, lambda s, f: interrupts.hit(s))  # events say SIGTERM, not ctrl-c
    with RunDisplay(client.store, run_id, after=after) as display:
        final = client.drive(run_id, reason=reason, on_tick=display, interrupts=interrupts)
    print(f"run {run_id} {final.value}")
    if final == RunState.PAUSED:
        print(f"resume with: segue resume {run_id}")
    return EXIT.get(final, 1)


def _detached(client: LocalClient, run_id: str, *, allow_code_change: bool = False) -> int:
    pid = client.start(run_id, allow_code_change=allow_code_change)
    print(run_id)  # `run --detach` and `resume --detach`: the run id, the pid on stderr
    print(f"controller pid {pid}; follow with: segue status {run_id}", file=sys.stderr)
    return 0


def cmd_run(a: argparse.Namespace, client: LocalClient) -> int:
    # SEGUE_<OPTION> variables are the user's defaults (documented in segue.run.options);
    # the flags override them, and the result is stored with the run.
    if a.gpus is not None and a.gpus < 0:
        raise UsageError(f"--gpus must be 0 or more, not {a.gpus}")
    defaults = RunOptions.from_env()
    run = client.prepare(
        a.flow, parse_overrides(a.param), run_id=a.run_id, options=defaults.to_json(),
        on_input_change=a.on_input_change, pause_deadline_s=a.pause_deadline,
        pause_on_failure=True if a.pause_on_failure else None,
        priority=None if a.priority is None else parse_priority(a.priority), gpus=a.gpus,
        gpu_memory=None if a.gpu_mem is None else parse_bytes(a.gpu_mem, "--gpu-mem", error=UsageError),
        preemptible=a.preemptible,
        max_pause=None if a.max_pause is None else parse_duration(a.max_pause, "--max-pause"),
        checkpoints=a.checkpoints, executor=a.executor, ray_address=a.ray_address,
        on_env_change=a.on_env_change,
    )
    if a.detach:
        return _detached(client, run.run_id)
    return _foreground(client, run.run_id, "started")


def cmd_resume(a: argparse.Namespace, client: LocalClient) -> int:
    client.prepare_resume(a.run, allow_code_change=a.allow_code_change, restart_step=a.restart_step,
                          on_input_change=a.on_input_change, on_env_change=a.on_env_change)
    env_cmd.warn_after_resume(client, a.run)  # what changed in its environment, if anything
    if a.detach:
        return _detached(client, a.run, allow_code_change=a.allow_code_change)
    # Print from this resume's request on, not the run's history (`segue events` has it).
    asked = client.store.list_events(a.run, kinds=("command",))
    return _foreground(client, a.run, "resumed by the operator", after=asked[-1].id - 1 if asked else 0)


def cmd_pause(a: argparse.Namespace, client: LocalClient) -> int:
    t0 = time.monotonic()
    try:
        run = client.pause(a.run, wait=a.wait, timeout=a.timeout)
    except WaitTimeoutError as exc:
        print(f"run {a.run} is {getattr(exc.state, 'value', exc.state)} after {time.monotonic() - t0:.2f}s", file=sys.stderr)
        return 1
    if not a.wait:
        print(f"run {a.run} {run.state.value}")
        return 0
    if run.state != RunState.PAUSED:
        print(f"run {a.run} is {run.state.value} after {time.monotonic() - t0:.2f}s", file=sys.stderr)
        return 1
    print(f"run {a.run} PAUSED after {time.monotonic() - t0:.2f}s")
    return 0


def cmd_status(a: argparse.Namespace, client: LocalClient) -> int:
    st = client.status(a.run, prices=dict(parse_price(p) for p in a.price), items=a.items)
    doc = st.to_json()
    if a.json:
        print_json(doc)
        return 0
    print(f"run {doc['run_id']}  {doc['shown'] or doc['state']}  flow {doc['flow']}")
    if doc.get("problem"):
        print(f"  {doc['problem']}")
    for s in doc["steps"]:
        print(_step_line(s, "  "))
        if s.get("items"):
            it = s["items"]
            counts = ", ".join(f"{n} {state}" for state, n in sorted(it["states"].items()))
            print(f"    {it['total']} task(s): {counts}")
            for kid in it["tasks"]:
                print(_step_line(kid, "    "))
            if it["more"]:
                print(f"    ... and {it['more']} more not done (`segue status {doc['run_id']} --items`)")
        if s.get("queue"):
            from ..run.status import queue_text

            print(f"    {queue_text(s['queue'])}")
        for fl in costs_view.failure_lines(doc["run_id"], s):
            print(fl)
    for line in costs_view.accounting_lines(doc["accounting"]):
        print(line)
    return 0


def _step_line(s: dict[str, Any], indent: str) -> str:
    p = s["progress"]
    prog = progress_text(p["done"], p["total"], p.get("unit"))
    ck = s["last_checkpoint"]
    ckt = "-" if ck is None else f"#{ck['seq']} at {fmt_time(ck['time'])}"
    if ck and (detail := position_detail(ck["position"])):
        ckt += f" ({detail})"
    line = f"{indent}{s['name']:<16} {s['state']:<10} progress {prog:<14} attempts {s['attempts']}  ckpt {ckt}"
    if s["pid"]:
        line += f"  pid {s['pid']}"
    if s["error"] and s["state"] != "SUCCEEDED":
        line += f"  error: {s['error']}"
    if s["waiting_for"]:
        line += f"  ({s['waiting_for']})"
    return line


def cmd_ls(a: argparse.Namespace, client: LocalClient) -> int:
    runs = client.runs(state=a.state, flow=a.flow, limit=a.limit)
    if a.json:
        print_json([{"run_id": r.run_id, "state": r.state.value, "shown": r.shown, "priority": r.priority,
                     "flow": r.flow, "created_at": r.created_at, "updated_at": r.updated_at}
                    for r in runs])
        return 0
    for r in runs:
        print(f"{r.run_id:<40} {r.shown:<16} {r.flow:<16} {fmt_time(r.created_at)}")
    return 0


def cmd_cancel(a: argparse.Namespace, client: LocalClient) -> int:
    run = client.cancel(a.run)
    print(f"run {a.run} {run.state.value}")
    return 0


def cmd_events(a: argparse.Namespace, client: LocalClient) -> int:
    events = client.events(a.run, after=a.after, follow=a.follow)
    if a.json and not a.follow:
        print_json([dataclasses.asdict(e) for e in events])
        return 0
    for e in events:  # --follow --json: one JSON object per line, as they come
        print(json.dumps(dataclasses.asdict(e)) if a.json else event_line(e), flush=a.follow)
    return 0


def cmd_checkpoints(a: argparse.Namespace, client: LocalClient) -> int:
    cks = client.checkpoints(a.run)
    if a.json:
        print_json([dataclasses.asdict(c) for c in cks])
    else:
        for c in cks:
            print(f"{c.step:<16} #{c.seq:<5} epoch {c.epoch:<3} {c.status:<11} {c.nbytes:>12} B  "
                  f"{fmt_time(c.created_at)}  {c.position}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, LocalClient], int]] = {
    "queue": sched.cmd_queue, "pool": sched.cmd_pool, "output": output_cmd.cmd_output,
    "logs": logs_cmd.cmd_logs, "metrics": metrics_cmd.cmd_metrics, "env": env_cmd.cmd_env,
    "verify": lambda a, c: verify.cmd_verify(a, c.home, pool=c.pool_path),
    "ckpt": lambda a, c: ckpt_run.cmd_ckpt(a, c),
    "prices": lambda a, c: prices_cmd.cmd_prices(a, c.home),
    "plan": lambda a, c: plan_cmd.cmd_plan(a, c.home),
    "bench-model": lambda a, c: bench_model_cmd.cmd_bench_model(a, c.home),
    "server": server_cmd.cmd_server, "token": server_cmd.cmd_token, "webhook": webhook_cmd.cmd_webhook,
    "run": cmd_run, "resume": cmd_resume, "pause": cmd_pause, "status": cmd_status, "ls": cmd_ls,
    "cancel": cmd_cancel, "events": cmd_events, "checkpoints": cmd_checkpoints,
    "agent": agent_cmd.cmd_agent, "hosts": agent_cmd.cmd_hosts,
    "schedule": schedule_cmd.cmd_schedule,
}


def one_line(message: str) -> str:
    """Errors print as one line, whatever a message embeds (a path with a newline...)."""
    return " ".join(message.split("\n")).strip() or "unknown error"


def main(argv: Sequence[str] | None = None) -> None:
    own_process()  # (segue.executor.ray_lean)
    try:
        a = build_parser().parse_args(argv)
        store = None
        if a.store is not None:
            from ..store import check_store_url

            store = check_store_url(a.store, "--store")
        # Everything the command starts (controllers, workers, verify sandboxes) is
        # given this home, this store and this pool explicitly, never through the
        # environment.
        client = LocalClient(a.home, store=store, pool=a.pool, actor=Actor.CLI)
        code = COMMANDS[a.cmd](a, client)
    except SegueError as exc:  # the exit code is the class's (table in segue.errors)
        print(f"segue: {one_line(str(exc))}", file=sys.stderr)
        code = exit_code(exc)
    except KeyboardInterrupt:  # ctrl-c outside a run's own handler (loading a flow, waiting)
        print("segue: interrupted; the run, if any, is as `segue status` shows", file=sys.stderr)
        code = 130
    except BrokenPipeError:  # `segue ls | head`: the reader left; that is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
