"""The client contract: what ``segue.Client`` does, whether it talks to a home or a server.

:class:`~segue.client.local.LocalClient` drives a home directly (the CLI's
way); :class:`~segue.client.http.HttpClient` talks to `segue server`. Both
pass the same contract tests (tests/client/test_contract.py). Errors are the
classes of :mod:`segue.errors` on both sides: an unknown run raises
:class:`~segue.errors.UnknownRunError` whether the store or a server said so.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from ..states import RunState
from .records import (
    CheckpointRecord,
    Event,
    MetricPoint,
    PoolChange,
    PoolView,
    QueueEntry,
    RunStatus,
    RunSummary,
)

# The states a run rests in: nothing moves it further without a command.
RESTING = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.PAUSED})
FINISHED = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
MAX_POOL_CHANGES = 1000  # the most pool changes one call returns (the server's page)


def check_changes_limit(limit: int) -> int:
    """``limit`` of :meth:`BaseClient.pool_changes`, checked the same way by both clients."""
    from ..errors import UsageError

    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_POOL_CHANGES:
        raise UsageError(f"limit must be an integer from 0 to {MAX_POOL_CHANGES}, not {limit!r}")
    return limit


class BaseClient(ABC):
    """Submit, steer and watch runs. Every method raises a :class:`~segue.SegueError` on failure."""

    # -- commands -------------------------------------------------------------------

    @abstractmethod
    def submit(
        self, flow: str, params: Mapping[str, Any] | None = None, *, run_id: str | None = None,
        priority: str | int | None = None, gpus: int | None = None, gpu_memory: str | int | None = None,
        preemptible: bool | None = None, max_pause: str | float | None = None,
        pause_deadline_s: float | None = None, pause_on_failure: bool | None = None,
        on_input_change: str | None = None, options: Mapping[str, Any] | None = None,
        on_env_change: str | None = None,
    ) -> RunSummary:
        """Create a run of the flow file ``flow`` and start its controller in the background.

        ``params`` are the flow's parameters (values of their declared types, or
        strings as on the command line). ``options``: further run options by
        name (``segue.RunOptions``), for example ``{"lease_ttl_s": 5}``. The run
        is validated completely before anything is written: a bad parameter, an
        unsatisfiable device request or a sink owned by another run raises a
        :class:`~segue.UsageError` and creates nothing.
        """

    @abstractmethod
    def pause(self, run: str, *, wait: bool = False, timeout: float | None = None) -> RunSummary:
        """Ask the run to pause at its next pause points.

        With ``wait``, return once the stored state is at rest (PAUSED, or a run
        that finished first); past ``timeout`` seconds raise :class:`~segue.errors.WaitTimeoutError`.
        """

    @abstractmethod
    def resume(self, run: str, *, allow_code_change: bool = False, restart_step: str | None = None,
               on_input_change: str | None = None, on_env_change: str | None = None) -> RunSummary:
        """Continue a paused, failed or orphaned run with a new background controller.

        ``on_env_change`` ("fail", "warn", "allow"; stored with the run): what to do
        when a distribution a step imported, or a declared variable, changed since
        the run last ran (see :meth:`environment`)."""

    @abstractmethod
    def cancel(self, run: str) -> RunSummary:
        """Cancel the run; its controller stops its attempts."""

    @abstractmethod
    def checkpoint_now(self, run: str) -> list[str]:
        """Ask every running task of the run to checkpoint at its next pause point, without
        pausing (`segue ckpt now RUN`); returns the steps asked. A run with no running task
        raises :class:`~segue.UsageError`."""

    # -- reading --------------------------------------------------------------------

    @abstractmethod
    def status(self, run: str) -> RunStatus:
        """The run, its steps, their progress and checkpoints, and its accounting."""

    @abstractmethod
    def runs(self, *, state: str | RunState | Collection[str | RunState] | None = None,
             flow: str | None = None, limit: int | None = None, offset: int = 0) -> list[RunSummary]:
        """Runs, newest first, filtered by state(s) and flow name."""

    @abstractmethod
    def events(self, run: str, *, after: int = 0, follow: bool = False) -> Iterator[Event]:
        """The run's events with id > ``after``, in order. With ``follow``, keep
        yielding new ones until the run rests (finished or paused)."""

    @abstractmethod
    def checkpoints(self, run: str) -> list[CheckpointRecord]:
        """Every checkpoint the run committed, quarantined and pruned ones included."""

    @abstractmethod
    def environment(self, run: str) -> dict[str, Any]:
        """The environment the run recorded (at submit, or at the last resume that went on
        over changes), the distributions each step imported, and the changes from it to the
        environment of the process that answers (`segue env RUN --json`)."""

    @abstractmethod
    def metrics(self, run: str, step: str | None = None, *,
                since: float | None = None) -> list[MetricPoint]:
        """What the run's steps logged with ``ctx.log_metrics`` (one step's if given;
        written after ``since``, a store time, if given): one point per (step, name,
        index), in step order, then by name and index. A value is None where the
        step logged NaN or an infinity."""

    @abstractmethod
    def output(self, run: str, step: str) -> Any:
        """The value step ``step`` returned (JSON-shaped: arrays become lists)."""

    @abstractmethod
    def logs(self, run: str, step: str | None = None, *, attempt: int | None = None,
             follow: bool = False) -> Iterator[str]:
        """What the run's attempts printed, in chunks of text. Without ``follow`` the
        chunks are what exists now; with it they keep coming until the run rests."""

    @abstractmethod
    def pool(self) -> PoolView:
        """This host's devices and who holds them."""

    @abstractmethod
    def configure_pool(self, *, gpus: int, gpu_memory: str | int = "80GB", cpus: float | None = None,
                       memory: str | int | None = None, gpu_type: str | None = None,
                       groups: Sequence[tuple[int, str | int, str | None]] = ()) -> PoolView:
        """Set this host's pool to virtual GPUs: ``gpus`` of ``gpu_memory`` (of type
        ``gpu_type``), then each group (count, memory, type); recorded with the actor."""

    @abstractmethod
    def pool_changes(self, *, limit: int = 100) -> list[PoolChange]:
        """Who changed this host's pool configuration and how, newest first (at most ``limit``)."""

    @abstractmethod
    def queue(self) -> list[QueueEntry]:
        """What waits for devices, and why (every home on this host)."""

    # -- lifetime -----------------------------------------------------------------------

    def close(self) -> None:  # noqa: B027  a client over a home holds nothing to release
        """Release connections (an HttpClient's sockets); the client is unusable after."""

    def __enter__(self) -> BaseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers built on the above ---------------------------------------------------

    def wait(self, run: str, states: Collection[str | RunState] = RESTING, timeout: float | None = None,
             poll_s: float = 0.1) -> RunSummary:
        """Return the run once its stored state is one of ``states``; raise
        :class:`~segue.errors.WaitTimeoutError` past ``timeout`` seconds."""
        import time

        from ..errors import WaitTimeoutError

        want = {RunState(s) for s in states}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            summary = self.summary(run)
            if summary.state in want:
                return summary
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(run, summary.state, sorted(s.value for s in want), timeout or 0.0)
            time.sleep(poll_s)

    def summary(self, run: str) -> RunSummary:
        """The run as one line of ``runs()``."""
        st = self.status(run)
        return RunSummary(run_id=st.run_id, state=st.state, shown=st.state.value, priority=st.priority,
                          flow=st.flow, created_at=st.created_at, updated_at=st.updated_at)
