"""How a comparison is run: the switches of ``parity compare`` that reach the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CompareOptions:
    """Engine options (compare.md §1.1).

    ``fuzzy_match`` pairs rows ignoring call counts (§3.4) in every mode; ``stack_mode`` is ``-s``, honoured
    only when a stack path is given explicitly (otherwise a stack.json next to the NPU dump.json turns the
    stack column on by itself); ``workers`` is the number of tensor-metric processes (None = automatic).
    """

    fuzzy_match: bool = False
    stack_mode: bool = False
    workers: int | None = None
