"""Errors of segue.data: re-exported from :mod:`segue.errors`, where the one tree lives.

Kept so ``from segue.data.errors import DataError`` goes on working; the
classes are the same objects as ``segue.errors.DataError`` and friends.
"""

from __future__ import annotations

from ..errors import (
    DataError,
    DeadLetterThresholdError,
    FencedError,
    IncompleteInputError,
    InputChangedError,
    MissingInputError,
    PositionError,
    SinkOwnedError,
    StagedOutputLostError,
)

__all__ = [
    "DataError",
    "DeadLetterThresholdError",
    "FencedError",
    "IncompleteInputError",
    "InputChangedError",
    "MissingInputError",
    "PositionError",
    "SinkOwnedError",
    "StagedOutputLostError",
]
