"""Flow declaration (model), parameter handling and loading from files."""

from .loader import LoadedFlow, changed_steps, load_flow
from .model import Flow, Param, Resources, StepSpec, parse_duration
from .params import parse_overrides, resolve

__all__ = [
    "Flow",
    "LoadedFlow",
    "Param",
    "Resources",
    "StepSpec",
    "changed_steps",
    "load_flow",
    "parse_duration",
    "parse_overrides",
    "resolve",
]
