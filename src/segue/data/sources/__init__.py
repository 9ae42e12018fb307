"""Sources: files (JSONL, CSV, Parquet) through fsspec, sequences, SQL queries."""

from .base import BadRecord, Batch, Position, Shard, Source
from .files import FileSource
from .lines import CsvShard, CsvSource, JsonlShard, JsonlSource
from .memory import RangeShard, SequenceSource
from .parquet import ParquetShard, ParquetSource
from .sql import KeyRangeShard, SqlSource

__all__ = [
    "BadRecord", "Batch", "CsvShard", "CsvSource", "FileSource", "JsonlShard", "JsonlSource",
    "KeyRangeShard", "ParquetShard", "ParquetSource", "Position", "RangeShard", "SequenceSource",
    "Shard", "Source", "SqlSource",
]
