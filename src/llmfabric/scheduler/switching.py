"""Flying Serving's switching policies, re-exported: the pure policies live in
`llmfabric.sim.switching` so the simulator (a lower layer than scheduler/) can run the SAME
policy objects as the engines without an import cycle. Import from either module."""

from llmfabric.sim.switching import (
    METHODS,
    SWITCH_POLICIES,
    Action,
    Bind,
    Method,
    Pending,
    PriorityWidth,
    Release,
    SwitchPolicy,
    SwitchState,
    actions_for_width,
    aligned_groups,
    context_length,
    ewma_rate,
    fits_width,
    hysteresis,
    load_threshold,
    make_policy,
    min_width,
    priority,
    rate_bounds,
    scheduled,
    segment,
)

__all__ = ["METHODS", "SWITCH_POLICIES", "Action", "Bind", "Method", "Pending", "PriorityWidth",
           "Release",
           "SwitchPolicy", "SwitchState", "actions_for_width", "aligned_groups",
           "context_length", "ewma_rate", "fits_width", "hysteresis", "load_threshold",
           "make_policy", "min_width", "priority", "rate_bounds", "scheduled", "segment"]
