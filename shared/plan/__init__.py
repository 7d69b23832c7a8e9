"""The next dump's plan from a comparison: which calls a tensor re-dump writes files for (``builder``), and
which calls fed or read them (``dataflow``)."""

from parity.shared.plan.builder import (
    DEFAULT_NEIGHBOURS,
    DEFAULT_TOP,
    STATISTICS_FOR_ALL,
    DumpLoader,
    Plan,
    PlanError,
    PlannedCall,
    call_entries,
    make_plan,
)
from parity.shared.plan.dataflow import DataFlow

__all__ = ["DEFAULT_NEIGHBOURS", "DEFAULT_TOP", "STATISTICS_FOR_ALL", "DataFlow", "DumpLoader", "Plan",
           "PlanError", "PlannedCall", "call_entries", "make_plan"]  # fmt: skip
