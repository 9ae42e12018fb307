"""Priority scheduling of accelerators: the pool, policies and preemption."""

from ..placement.policy import (
    PRIORITY_CLASSES,
    Capacity,
    Device,
    Holder,
    Need,
    choose_victims,
    default_preemptible,
    effective_priority,
    parse_priority,
    place,
    priority_name,
)

__all__ = [
    "PRIORITY_CLASSES",
    "Capacity",
    "Device",
    "Holder",
    "Need",
    "choose_victims",
    "default_preemptible",
    "effective_priority",
    "parse_priority",
    "place",
    "priority_name",
]
