"""Helpers for the tests that run segue on a real Ray cluster (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

from typing import Any

from segue_helpers import Segue, wait_for

MiB = 2**20


def start_cluster(ray: Any, nodes: list[dict[str, Any]]) -> Any:
    """A head with no CPUs (attempts never land on it: its loss is the cluster's) and
    ``nodes``, with node health checks shortened so that a removed node is declared
    dead in about three seconds; this process joins it as a driver. Not shorter: on
    a loaded 2-core box 0.6 s of missed heartbeats declared a live node (once, the
    head's) dead, and the next run's controller never reached the cluster."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80 * MiB,
        "_system_config": {"health_check_period_ms": 300, "health_check_failure_threshold": 10,
                           "health_check_initial_delay_ms": 0}})
    for node in nodes:
        c.add_node(**node)
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    return c


def on_ray(cluster: Any) -> tuple[str, ...]:
    return ("--executor", "ray", "--ray-address", cluster.address)


def explain(ray: Any, segue: Segue, run: str, pred: Any, timeout: float, what: str) -> Any:
    """wait_for, and on a timeout say what the run and the cluster were doing."""
    try:
        return wait_for(pred, timeout, what)
    except AssertionError:
        logs = segue("logs", run).stdout
        ctl = segue.home / "logs" / run / "controller.log"
        ctl_text = ctl.read_text(errors="replace")[-3000:] if ctl.exists() else "(no controller.log)"
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}\nevents:\n{segue('events', run).stdout}\n"
            f"logs:\n{logs[-3000:]}\ncontroller.log:\n{ctl_text}\nRay available: {ray.available_resources()}\n"
            f"Ray total: {ray.cluster_resources()}") from None
