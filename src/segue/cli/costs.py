"""How `segue status` prints accounting and failures (docs/accounting.md defines the figures)."""

from __future__ import annotations

from typing import Any


def _money(x: float) -> str:
    return f"${x:,.2f}" if x >= 0.01 or x == 0 else f"${x:.4f}"


def accounting_lines(acct: dict[str, Any]) -> list[str]:
    c = acct["cost"]
    models = []
    if acct.get("model_loads"):
        models = [f"  models   {acct['model_loads']} loads in {acct['model_load_seconds']:.1f}s; "
                  f"{acct['model_reloads']} reloads after interruptions cost {acct['model_reload_seconds']:.1f}s "
                  f"({acct['model_reload_bytes'] / 2**20:.1f} MiB loaded again)"]
    return [
        f"  time     attempts {acct['attempt_seconds']:.1f}s  paused {acct['paused_seconds']:.1f}s  "
        f"redone {acct['work_redone_seconds']:.1f}s  preemptions {acct['preemptions']}  "
        f"resumes {acct['resumes']}",
        f"  devices  {acct['device_seconds']:.1f} device-s = {acct['device_seconds_useful']:.1f} useful "
        f"+ {acct['device_seconds_redone']:.1f} redone; {acct['cpu_core_seconds']:.1f} core-s; "
        f"resuming saved {acct['device_seconds_saved_by_resume']:.1f} device-s "
        f"({acct['seconds_saved_by_resume']:.1f}s over {acct['resumes']} resumes)",
        f"  cost     {_money(c['so_far'])} so far = {_money(c['useful'])} useful + "
        f"{_money(c['redone'])} redone; {_money(c['avoided_by_resume'])} avoided by resuming",
        f"  storage  {acct['checkpoint_bytes_stored'] / 2**20:.1f} MiB of checkpoints stored "
        f"({acct['checkpoint_bytes'] / 2**20:.1f} MiB written): {_money(c['storage_so_far'])} so far, "
        f"{_money(c['storage_per_month'])}/month while kept (paused runs pay it too)",
        *models,
    ]


def failure_lines(run_id: str, step: dict[str, Any]) -> list[str]:
    """The end of the last failed attempt's traceback, for a step that has not succeeded."""
    f = step.get("last_failure")
    if not f or step["state"] == "SUCCEEDED":
        return []
    # Without a current error the failure is history: a later attempt runs or waits.
    earlier = "" if step.get("error") else "earlier: "
    out = [f"    {earlier}attempt {f['attempt']} failed: {f['error']}"]
    out += [f"    | {ln}" for ln in f.get("traceback_tail") or []]
    out.append(f"    full log: segue logs {run_id} {step['name']} --attempt {f['attempt']}")
    return out
