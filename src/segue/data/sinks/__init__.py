"""Sinks committed with the step checkpoint (two-phase commit)."""

from .base import Scope, Sink
from .external import ExternalCallSink
from .files import FileSink, JsonlSink, ParquetSink
from .sql import SqlSink

__all__ = ["ExternalCallSink", "FileSink", "JsonlSink", "ParquetSink", "Scope", "Sink", "SqlSink"]
