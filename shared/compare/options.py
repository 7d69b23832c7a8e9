"""How a comparison is run: the switches of ``parity compare`` that reach the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from parity.shared.compare.mapping import RowMapping
    from parity.shared.replay.sandbox import ReplayBudget
    from parity.shared.tensor_io import TensorLimits


#: Tensor mode replays about this many top calls in float64 (``replay_judgement`` adds a few: see there).
REPLAY_TOP = 10
#: How many suspects are named: the top of a step-directory summary across its ranks (the server's summary
#: too), each rank's on the terminal (``parity compare``), a comparison's in ``compare-runs``.
TOP_SUSPECTS = 10


@dataclass(frozen=True, slots=True)
class CompareOptions:
    """Engine options (compare.md §1.1).

    ``fuzzy_match`` pairs rows ignoring call counts (§3.4) in every mode; ``stack_mode`` is ``-s``, honoured
    only when a stack path is given explicitly (otherwise a stack.json next to the NPU dump.json turns the
    stack column on by itself). ``executor`` runs the tensor-mode metrics: the entry point that owns the
    process builds it (``parity.process_policy.metric_executor``) and shuts it down; None runs them in the
    calling thread. The rows are the same either way. ``data_mapping`` (``-dm``) pairs the rows it names as
    it says, whatever the alignment chose. ``replay_top``: how many top calls the float64 replay
    judges (``replay_judgement``), part of the judgement of the suspects; it changes no row.
    ``replay_budget``: the replays run in a child process under that budget (``replay.sandbox``: memory and
    CPU capped, a crash loses only its call's verdict); the entry point that owns the process decides (the
    CLI and the server's workers set it); None runs them in the calling process.
    ``mixed_tasks``: a tensor dump against a statistics dump is compared in statistics mode (a tensor dump
    records the statistics too) instead of refused as msprobe refuses it; the server's comparisons set it.
    """

    fuzzy_match: bool = False
    stack_mode: bool = False
    replay_top: int = REPLAY_TOP  # tensor mode: replay this many top calls (and a few more); 0: none
    tensor_limits: TensorLimits | None = None  # the caps of every tensor load (None: the defaults)
    mixed_tasks: bool = False
    executor: Executor | None = field(default=None, compare=False, repr=False)
    data_mapping: RowMapping | None = None  # ``-dm``/``-cm``: the user's own pairs, over the alignment
    replay_budget: ReplayBudget | None = None
