"""Column headers of the compare table, in msprobe v1's exact order (compare.md §8.1).

Parity's own extra columns always follow msprobe's, so a sheet msprobe users know reads the same up to its
last msprobe column.
"""

from __future__ import annotations

from enum import Enum


class CompareMode(str, Enum):
    """How a pair of dumps is compared, decided from the dumps themselves (compare.md §1.4)."""

    TENSOR = "tensor"
    STATISTICS = "statistics"
    MD5 = "md5"


BASIC = [
    "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype",
    "NPU Tensor Shape", "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad",
]  # fmt: skip
STATS = [
    "NPU max", "NPU min", "NPU mean", "NPU l2norm",
    "Bench max", "Bench min", "Bench mean", "Bench l2norm",
]  # fmt: skip
TENSOR_METRICS = [
    "Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr",
    "One Thousandth Err Ratio", "Five Thousandths Err Ratio",
]  # fmt: skip
STATISTICS_METRICS = [
    "Max diff", "Min diff", "Mean diff", "L2norm diff",
    "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr",
]  # fmt: skip
STACK = "NPU_Stack_Info"
DATA_NAME = "Data_name"

# Parity's own columns, after msprobe's: the typed status of the row, the dump entry it belongs to, what
# paired it with its bench row (``name``, ``aligned``, ``mapped`` by -dm, ``gap``; empty: unpaired) and
# the gap it belongs to (``target A ~ bench B ... C``: calls without a partner, judged as one).
PARITY_STATUS = "Parity Status"
PARITY_API = "Parity API"
PARITY_PAIRING = "Parity Pairing"
PARITY_GAP = "Parity Gap"
PARITY_EXTRA = [PARITY_STATUS, PARITY_API, PARITY_PAIRING, PARITY_GAP]


def msprobe_header(mode: CompareMode, *, stack: bool) -> list[str]:
    """msprobe v1's header for ``mode``, with the stack column where a stack.json is in force."""
    stack_col = [STACK] if stack else []
    if mode is CompareMode.TENSOR:
        return [*BASIC, *TENSOR_METRICS, *STATS, "Requires_grad Consistent", "Accuracy Reached or Not",
                "Err_message", *stack_col, DATA_NAME]  # fmt: skip
    if mode is CompareMode.STATISTICS:
        return [*BASIC, *STATISTICS_METRICS, *STATS, "Requires_grad Consistent", "Result", "Err_message",
                *stack_col]  # fmt: skip
    return [*BASIC, "NPU MD5", "BENCH MD5", "Requires_grad Consistent", "Result", *stack_col]


def full_header(mode: CompareMode, *, stack: bool) -> list[str]:
    """msprobe's header followed by Parity's extra columns: the header of every Parity report."""
    return [*msprobe_header(mode, stack=stack), *PARITY_EXTRA]
