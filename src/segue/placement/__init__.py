"""Placement: the pure rules of where a step may run and what a device costs.

``policy`` (priorities, a step's need, what fits on which device, which holder
yields) and ``pricing`` (the price catalog and device types). Below the store
and the scheduler, which both decide with them; they import nothing above
``errors``.
"""
