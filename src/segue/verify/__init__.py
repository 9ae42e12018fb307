"""`segue verify`: prove that a flow's output survives faults unchanged."""

from .campaign import Report, plan, run_verify
from .compare import Diff, Snapshot, compare, snapshot

__all__ = ["Diff", "Report", "Snapshot", "compare", "plan", "run_verify", "snapshot"]
