"""The order of a comparison's columns on its page: what a reader judges a row by first.

The xlsx report and the rows endpoint keep msprobe's column order (scripts read them by position); the page
puts the name, the verdict and the mode's error measures first, so they are on screen without scrolling
sideways, and the rest after them in msprobe's order.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Per mode (recognised by a column only it has), the columns shown first, in this order.
FIRST_COLUMNS: dict[str, tuple[str, ...]] = {
    "Cosine": ("NPU Name", "Parity Status", "Cosine", "MaxRelativeErr", "MaxAbsErr",
               "One Thousandth Err Ratio", "Accuracy Reached or Not", "Err_message"),  # tensor mode
    "NormRelativeErr": ("NPU Name", "Parity Status", "MaxRelativeErr", "NormRelativeErr", "MeanRelativeErr",
                        "MinRelativeErr", "Result", "Err_message"),  # statistics mode
    "NPU MD5": ("NPU Name", "Parity Status", "NPU MD5", "BENCH MD5", "Result"),  # md5 mode
}
#: Shown right after them, in every mode.
THEN_COLUMNS = ("NPU Dtype", "Bench Dtype", "Bench Name")


def page_order(header: Sequence[str]) -> list[int]:
    """Indexes of ``header``'s columns in page order: each listed column once, unknown ones after."""
    first: tuple[str, ...] = ("NPU Name", "Parity Status")
    for marker, columns in FIRST_COLUMNS.items():
        if marker in header:
            first = columns
            break
    position = {name: i for i, name in enumerate(header)}
    order = [position[name] for name in (*first, *THEN_COLUMNS) if name in position]
    seen = set(order)
    return order + [i for i in range(len(header)) if i not in seen]
