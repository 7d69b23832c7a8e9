"""Uninitialised memory is not data: the rows that hold a buffer's contents before anything wrote them.

``torch.empty_like(x)`` returns whatever the allocator had there: two seeded, identical runs of a MoE model
(``buf = torch.empty_like(h); buf[idx] = expert(h[idx])``) differ in it, and compared as values its rows
fail and the empty call is the first suspect. Those rows are flagged ``F_UNINITIALISED``: not compared as
values, never failing, never an error of a call. Three kinds of rows:

* the outputs of an allocation that does not initialise (``EMPTY_OPS``);
* an ``out=`` argument: the destination of a call, whose earlier contents the call overwrites;
* the destination (``self``, input 0) of a call that fills a tensor in place (``FILL_OPS``) while the side
  has such a buffer of its dimensions and dtype, and, where that destination differs between the sides,
  the call's outputs (they hold the unwritten part). The call is then judged on what it writes: its
  other inputs, which are compared as usual, and the calls that read the filled buffer.

A dump records no tensor identity, so a destination is recognised by its dimensions and dtype against the
buffers allocated before it on the same side: a fill of a tensor of the same shape that was never empty
loses only its destination's comparison, which is the output of an earlier call, compared there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from parity.shared.compare.facts import RowFacts, SideFacts
from parity.shared.dump.columns import STATE_OUTPUT
from parity.shared.dump.naming import FORWARD, parse_entry

__all__ = ["EMPTY_OPS", "FILL_OPS", "MSG_UNINITIALISED", "uninitialised_rows"]

#: Ops that allocate without initialising (``EntryName.op``: underscores stripped).
EMPTY_OPS = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                       "empty_permuted"})  # fmt: skip
#: Ops that write into their ``self`` (input 0) in place, element by element.
FILL_OPS = frozenset({"setitem", "index_copy", "index_put", "index_fill", "masked_scatter", "scatter",
                      "scatter_reduce", "copy", "fill", "zero", "put", "masked_fill",
                      "index_add"})  # fmt: skip
#: The Err_message of such a row.
MSG_UNINITIALISED = "Uninitialised memory: not compared as values (an empty buffer before it is written)."
#: an ``out=`` argument's row (tensor mode names it from its file, ``...forward.kwargs.out``; ``out`` may be
#: a tuple of tensors)
_OUT_ARGUMENT = re.compile(r"\.(?:input|kwargs)\.out(?:\.\d+)*$")
_DESTINATION = ".input.0"


def uninitialised_rows(facts: RowFacts, states: Sequence[str], apis: Sequence[str]) -> np.ndarray:
    """Which rows of a table (``apis``: each row's entry, the NPU's) hold uninitialised memory (the module
    docstring), as a bool array over the rows."""
    n = len(apis)
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    ops: dict[str, tuple[str, bool]] = {}
    for api in dict.fromkeys(apis):
        parsed = parse_entry(api)
        ops[api] = (parsed.op, parsed.direction == FORWARD) if parsed is not None else ("", False)
    sides = (facts.npu, facts.bench)
    buffers: tuple[set[tuple[object, object]], set[tuple[object, object]]] = (set(), set())
    fill_start = -1
    names = facts.names
    for i in range(n):
        api = apis[i]
        op, forward = ops[api]
        if i and apis[i - 1] != api:
            fill_start = -1
        state = states[i]
        if op in EMPTY_OPS and state == STATE_OUTPUT:
            out[i] = True
            for side, found in zip(sides, buffers, strict=True):
                if side.present[i] and side.tensor[i]:
                    found.add((side.dims[i], side.dtype[i]))
            continue
        name = names[i]
        tensor = sides[0].tensor[i] or sides[1].tensor[i]
        if state != STATE_OUTPUT and tensor and _OUT_ARGUMENT.search(name):
            out[i] = True
        elif forward and op in FILL_OPS and (buffers[0] or buffers[1]):
            if name.endswith(_DESTINATION) and state != STATE_OUTPUT and _is_buffer(sides, buffers, i):
                out[i] = True
                if not _same_values(sides, i):
                    fill_start = i  # its outputs hold the unwritten part of the buffer
            elif fill_start >= 0 and state == STATE_OUTPUT:
                out[i] = True
    return out


def _is_buffer(sides: tuple[SideFacts, SideFacts], buffers: tuple[set[tuple[object, object]], ...],
               i: int) -> bool:  # fmt: skip
    return any(side.present[i] and side.tensor[i] and (side.dims[i], side.dtype[i]) in found
               for side, found in zip(sides, buffers, strict=True))  # fmt: skip


def _same_values(sides: tuple[SideFacts, SideFacts], i: int) -> bool:
    """The row holds the same values on both sides, as far as the dump tells (md5, else the statistics)."""
    npu, bench = sides
    if not (npu.present[i] and bench.present[i]):
        return False
    if npu.md5[i] is not None and bench.md5[i] is not None:
        return npu.md5[i] == bench.md5[i]
    a, b = npu.stats_array()[i], bench.stats_array()[i]
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b)))) and npu.dims[i] == bench.dims[i]
