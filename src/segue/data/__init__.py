"""segue.data: resumable sources, exactly-once sinks, and the map-step driver.

    from segue.data import JsonlSource, JsonlSink, run_map

    @flow.step(retries=3, checkpoint_every="10s")
    def score(ctx):
        return run_map(ctx, JsonlSource("in/*.jsonl"), score_one, JsonlSink("out/"))

Modules: ``sources/`` (what is read, and positions), ``sinks/`` (two-phase
commit), ``operators`` (map, filter, flat_map, map_batches), ``pinning``
(input snapshots), ``driver`` (the loop), ``ranked`` (a gang's ranks' data, with one
global position that reshards). See docs/data.md.
"""

from . import mapstep as _mapstep  # noqa: F401  # registers @flow.map's step class with flow
from .driver import Limits, MapRun
from .errors import (
    DataError,
    DeadLetterThresholdError,
    IncompleteInputError,
    InputChangedError,
    PositionError,
    StagedOutputLostError,
)
from .operators import KINDS, Operator, Rejected, operator
from .pinning import POLICIES
from .ranked import GangReader, GangSampler
from .runmap import run_map
from .sinks import ExternalCallSink, FileSink, JsonlSink, ParquetSink, Scope, Sink, SqlSink
from .sources import (
    BadRecord,
    Batch,
    CsvSource,
    FileSource,
    JsonlSource,
    ParquetSource,
    SequenceSource,
    Shard,
    Source,
    SqlSource,
)

__all__ = [
    "BadRecord",
    "Batch",
    "CsvSource",
    "DataError",
    "DeadLetterThresholdError",
    "ExternalCallSink",
    "FileSink",
    "FileSource",
    "GangReader",
    "GangSampler",
    "IncompleteInputError",
    "InputChangedError",
    "JsonlSink",
    "JsonlSource",
    "KINDS",
    "Limits",
    "MapRun",
    "Operator",
    "POLICIES",
    "ParquetSink",
    "ParquetSource",
    "PositionError",
    "Rejected",
    "Scope",
    "SequenceSource",
    "Shard",
    "Sink",
    "Source",
    "SqlSink",
    "SqlSource",
    "StagedOutputLostError",
    "operator",
    "run_map",
]
