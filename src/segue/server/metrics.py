"""``GET /metrics``: the home's runs, checkpoints and devices in the Prometheus text format.

A custom collector in its own registry (never the global one) computes every
figure from the store at scrape time, so the numbers are the store's, whoever
wrote them (controllers, workers, the CLI), and a restarted server reports the
same totals. Counters are a function of the event log: the collector reads it
once, then only the events written since its previous scrape
(:mod:`segue.store.metrics_rows`; on PostgreSQL :mod:`segue.store.postgres_metrics`),
so scrapes stay cheap with thousands of runs. Its cursor is a commit position
(the event id on SQLite, a transaction id on PostgreSQL), so an event committed
late is still counted, once. No run id is ever a label.

Access: the viewer role, like the rest of the read API (Prometheus sends the
token with ``authorization: {type: Bearer, credentials_file: ...}``, see
docs/metrics.md). ``app.state.metrics_public = True`` serves it to anyone.

    segue_runs{state}                               gauge
    segue_step_attempts_started_total               counter
    segue_step_attempts_total{outcome}              counter  succeeded|failed|parked|cancelled|lost
    segue_checkpoints_total{outcome}                counter  committed|quarantined|pruned
    segue_checkpoint_duration_seconds               histogram  step's call -> durable manifest
    segue_checkpoint_size_bytes                     histogram
    segue_checkpoint_live_bytes{status}             gauge    committed|quarantined (not pruned)
    segue_preemptions_total                         counter
    segue_pause_latency_seconds                     histogram  PAUSING -> PAUSED
    segue_records_processed_total                   counter  data steps: records read and committed
    segue_records_written_total                     counter
    segue_records_dead_lettered_total               counter
    segue_pool_devices{state}                       gauge    allocated|free (the machine's pool)
    segue_pool_device_allocated{device,name}        gauge    0 or 1
    segue_pool_cpus / segue_pool_cpus_allocated     gauge    cpus allocated: this home's share
    segue_webhook_deliveries{status}                gauge    pending|sending|delivered|failed
    segue_step_metric{flow,step,metric}             gauge    ctx.log_metrics: the newest value
                                                             (NaN where the step logged NaN)
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from ..client.local import LocalClient
from ..client.records import PoolView
from ..home import Home
from ..states import Actor, RunState, TaskState
from ..store import open_metrics_reader
from ..store.metrics_rows import MetricEvent, MetricsReader, Now
from ..store.outbox import STATUSES as DELIVERY_STATUSES
from ..store.postgres_metrics import PostgresMetricsReader
from .app import _EXTENSIONS
from .auth import LOCAL, Principal, Role
from .security import Security

log = logging.getLogger("segue.server")

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                    300.0, 600.0)
SIZE_BUCKETS = tuple(float(1024 * 4**k) for k in range(16))  # 1 KiB .. 1 TiB
PAUSE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

# The state an attempt's task left RUNNING for -> the attempt's outcome.
ATTEMPT_OUTCOMES: dict[str, str] = {
    TaskState.SUCCEEDED.value: "succeeded", TaskState.RETRYING.value: "failed",
    TaskState.FAILED.value: "failed", TaskState.PARKED.value: "parked",
    TaskState.CANCELLED.value: "cancelled", TaskState.PENDING.value: "lost",
}
CHECKPOINT_OUTCOMES = ("committed", "quarantined", "pruned")


@dataclass
class Histogram:
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last: +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1  # le: v <= bound
        self.total += v

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        cum, buckets = 0, []
        for bound, n in zip([*map(_fmt, self.bounds), "+Inf"], self.counts, strict=True):
            cum += n
            buckets.append((bound, cum))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.total)


def _fmt(x: float) -> str:
    return repr(float(x))


@dataclass
class Tally:
    """Counters folded from the event log, from its start up to the commit position ``last_pos``."""

    last_pos: int = 0
    attempts_started: int = 0
    attempts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("succeeded", "failed", "parked", "cancelled", "lost"), 0))
    checkpoints: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKPOINT_OUTCOMES, 0))
    preemptions: int = 0
    ckpt_duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    ckpt_size: Histogram = field(default_factory=lambda: Histogram(SIZE_BUCKETS))
    pause_latency: Histogram = field(default_factory=lambda: Histogram(PAUSE_BUCKETS))
    pausing_since: dict[str, float] = field(default_factory=dict)  # runs PAUSING now only

    def absorb(self, events: Iterable[MetricEvent]) -> None:
        for e in events:
            self.last_pos = max(self.last_pos, e.pos)
            if e.kind == "task":
                self._task(e)
            elif e.kind == "checkpoint":
                self._checkpoint(e)
            elif e.kind == "run" and e.to_state is not None:
                self._run(e)

    def _task(self, e: MetricEvent) -> None:
        if e.to_state == TaskState.RUNNING:
            self.attempts_started += 1
        elif e.from_state == TaskState.RUNNING and e.to_state is not None:
            outcome = ATTEMPT_OUTCOMES.get(e.to_state)
            if outcome is not None:
                self.attempts[outcome] += 1

    def _checkpoint(self, e: MetricEvent) -> None:
        if e.to_state is None and e.nbytes is not None:  # the commit itself
            self.checkpoints["committed"] += 1
            self.ckpt_size.observe(float(e.nbytes))
            if e.duration_s is not None:
                self.ckpt_duration.observe(float(e.duration_s))
        elif e.to_state in ("quarantined", "pruned") and e.from_state != e.to_state:
            self.checkpoints[e.to_state] += 1

    def _run(self, e: MetricEvent) -> None:
        if e.to_state == RunState.PAUSING:
            self.pausing_since[e.run_id] = e.time
            if e.actor == Actor.SCHEDULER:
                self.preemptions += 1
            return
        since = self.pausing_since.pop(e.run_id, None)
        if since is not None and e.to_state == RunState.PAUSED and e.from_state == RunState.PAUSING:
            self.pause_latency.observe(max(0.0, e.time - since))


class StoreCollector(Collector):
    """Computes the metrics of one home at each scrape; safe to scrape concurrently."""

    def __init__(self, home: Home, pool_view: Callable[[], PoolView | None] | None = None) -> None:
        self.home = home
        self._reader: MetricsReader | PostgresMetricsReader | None = None  # opened at the first scrape
        self.pool_view = pool_view
        self.tally = Tally()
        self._lock = threading.Lock()

    @property
    def reader(self) -> MetricsReader | PostgresMetricsReader:
        """The reader of the home's store (SQLite or PostgreSQL)."""
        if self._reader is None:
            self._reader = open_metrics_reader(self.home.root, self.home.store)
        return self._reader

    def collect(self) -> Iterator[Metric]:
        with self._lock:  # one scrape folds the log at a time; the tally is shared
            if self.home.exists():
                upto = self.reader.last_position()
                while self.tally.last_pos < upto:
                    page = self.reader.events_after(self.tally.last_pos, upto)
                    if not page:
                        break
                    self.tally.absorb(page)
                self.tally.last_pos = max(self.tally.last_pos, upto)
                now = self.reader.now()
            else:  # a fresh home: zeros, and nothing is created by a scrape
                now = Now()
            yield from self._store_families(now)
        yield from self._pool_families()

    def _store_families(self, now: Now) -> Iterator[Metric]:
        t = self.tally
        g = GaugeMetricFamily("segue_runs", "Runs of the home by state.", labels=["state"])
        for s in RunState:
            g.add_metric([s.value], now.runs_by_state.get(s.value, 0))
        yield g
        yield CounterMetricFamily("segue_step_attempts_started", "Step attempts started.",
                                  value=t.attempts_started)
        c = CounterMetricFamily("segue_step_attempts", "Step attempts that ended, by outcome "
                                "(failed: retried or final; lost: with its controller).",
                                labels=["outcome"])
        for k, v in t.attempts.items():
            c.add_metric([k], v)
        yield c
        c = CounterMetricFamily("segue_checkpoints", "Checkpoints committed, and later quarantined "
                                "or pruned.", labels=["outcome"])
        for k, v in t.checkpoints.items():
            c.add_metric([k], v)
        yield c
        yield t.ckpt_duration.family("segue_checkpoint_duration_seconds",
                                     "Checkpoint save time, from the step's call to the durable "
                                     "manifest (committed checkpoints).")
        yield t.ckpt_size.family("segue_checkpoint_size_bytes", "Size of committed checkpoints.")
        g = GaugeMetricFamily("segue_checkpoint_live_bytes", "Bytes of checkpoints not pruned.",
                              labels=["status"])
        for status in ("committed", "quarantined"):
            g.add_metric([status], now.live_checkpoint_bytes.get(status, 0))
        yield g
        yield CounterMetricFamily("segue_preemptions", "Runs paused by the scheduler for "
                                  "higher-priority work.", value=t.preemptions)
        yield t.pause_latency.family("segue_pause_latency_seconds", "Time from PAUSING to PAUSED.")
        for name, key, doc in (
            ("segue_records_processed", "records_in", "Records data steps read, as of their "
             "newest committed checkpoints."),
            ("segue_records_written", "records_out", "Records data steps wrote."),
            ("segue_records_dead_lettered", "failures", "Records that went to dead-letter sinks."),
        ):
            yield CounterMetricFamily(name, doc, value=now.records.get(key, 0.0))
        g = GaugeMetricFamily("segue_webhook_deliveries", "Webhook deliveries in the outbox, by "
                              "status.", labels=["status"])
        for status in DELIVERY_STATUSES:
            g.add_metric([status], now.deliveries.get(status, 0))
        yield g
        # The newest point of each metric of any run of the flow: per flow, never per
        # run (a run id label would make a new series for every run).
        g = GaugeMetricFamily("segue_step_metric", "The newest value a flow's step logged with "
                              "ctx.log_metrics, whichever run logged it.",
                              labels=["flow", "step", "metric"])
        for flow, step, name, value in now.step_metrics:
            g.add_metric([flow, step, name], math.nan if value is None else value)
        yield g

    def _pool_families(self) -> Iterator[Metric]:
        if self.pool_view is None:
            return
        try:
            view = self.pool_view()
        except Exception as exc:  # the pool is another file: a scrape still reports the home
            log.warning("metrics: cannot read the device pool: %s", exc)
            return
        if view is None:
            return
        held = sum(1 for d in view.devices if d.holder is not None)
        g = GaugeMetricFamily("segue_pool_devices", "Devices of this machine's pool.",
                              labels=["state"])
        g.add_metric(["allocated"], held)
        g.add_metric(["free"], len(view.devices) - held)
        yield g
        g = GaugeMetricFamily("segue_pool_device_allocated", "1 while the device is allocated.",
                              labels=["device", "name"])
        for d in view.devices:
            g.add_metric([str(d.index), d.name], 1 if d.holder is not None else 0)
        yield g
        yield GaugeMetricFamily("segue_pool_cpus", "CPU cores of this machine's pool.",
                                value=view.cpus)
        yield GaugeMetricFamily("segue_pool_cpus_allocated", "CPU cores allocated to this home's "
                                "runs.", value=view.cpus_allocated)


def metrics_registry(home: Home, pool_view: Callable[[], Any]) -> tuple[CollectorRegistry, StoreCollector]:
    """A registry holding only the home's collector (never the process-global one);
    ``pool_view`` reads the host pool (the server's client: its connections are shared)."""
    collector = StoreCollector(home, pool_view=pool_view)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry, collector


def _warm_up(collector: StoreCollector) -> None:
    """Fold the event log once, in the background: the first scrape of a home with
    millions of events then does not run into the scraper's timeout."""
    try:
        for _ in collector.collect():
            pass
    except Exception as exc:  # a scrape will say it again, as a 500
        log.warning("metrics: warming up failed: %s", exc)


def register(app: FastAPI, client_for: Callable[[Principal], LocalClient], sec: Security) -> None:
    registry, collector = metrics_registry(app.state.home, client_for(LOCAL).pool)
    app.router.on_startup.append(lambda: threading.Thread(
        target=_warm_up, args=(collector,), name="segue-metrics-warm-up", daemon=True).start())

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if not getattr(request.app.state, "metrics_public", False):
            sec.check(request, Role.VIEWER)  # 401/403 like every read route
        # The format the scraper asks for (Accept): OpenMetrics, or the classic text.
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), headers={"Content-Type": content_type,
                                                   "Cache-Control": "no-store"})


if register not in _EXTENSIONS:
    _EXTENSIONS.append(register)
