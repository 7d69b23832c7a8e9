"""One record per API call of a compared rank: its worst status and the error of its outputs, in call order.

The server stores these (``comparison_calls``) for its chart, heatmap, API history and regression verdicts;
the CLI can print them. They come from the rows' typed facts, so a record holds the numbers the engine
computed, never a cell parsed back (``"12.5%"``).

A call's error here is what msprobe's columns say of its outputs: the largest MaxRelativeErr (tensor mode:
the metric; statistics mode: the relative change of the Max statistic) and ``1 - min(Cosine)``; the
inputs count only for a call without outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from parity.shared.compare.headers import CompareMode
from parity.shared.compare.result import CompareResult, RowStatus
from parity.shared.dump.columns import STATE_OUTPUT
from parity.shared.dump.naming import direction_of

__all__ = ["STATUS_RANK", "call_records"]

#: Worst first: the status a call shows is the worst of its rows'.
STATUS_RANK = {"fail": 5, "unmatched": 4, "warning": 3, "uncomparable": 2, "bench-only": 1, "pass": 0}


def _row_errors(result: CompareResult) -> tuple[np.ndarray, np.ndarray]:
    """Each row's relative error of its Max (or the metric) and its cosine, NaN where there is none."""
    facts = result.facts
    assert facts is not None
    if result.mode is CompareMode.TENSOR:
        metrics = facts.metrics_array()
        rel, cos = np.abs(metrics[:, 3]), metrics[:, 0]
    else:
        a, b = facts.npu.stats_array()[:, 0], facts.bench.stats_array()[:, 0]
        with np.errstate(all="ignore"):
            rel = np.abs((a - b) / b)
        rel[~(facts.npu.numeric_array()[:, 0] & facts.bench.numeric_array()[:, 0]) | (b == 0.0)] = np.nan
        cos = np.full(len(facts), np.nan)
    rel = np.where(np.isfinite(rel), rel, np.nan)
    cos = np.where(np.isfinite(cos), cos, np.nan)
    return rel, cos


def call_records(result: CompareResult) -> list[dict[str, Any]]:
    """The rank's calls in row order: ``api``, ``backward``, ``status``, ``max_rel_err``, ``one_minus_cos``
    (None where no output row has a number) and ``first_row``."""
    if result.facts is None or not result.rows:
        return []
    rel, cos = _row_errors(result)
    rel_list, cos_list = rel.tolist(), cos.tolist()
    out: list[dict[str, Any]] = []
    by_api: dict[str, dict[str, Any]] = {}
    names = result.facts.names
    for i, row in enumerate(result.rows):
        call = by_api.get(row.api)
        if call is None:
            call = by_api[row.api] = {"api": row.api, "backward": direction_of(row.api) == "backward",
                                      "status": RowStatus.PASS.value, "max_rel_err": None,
                                      "one_minus_cos": None, "first_row": i, "_outputs": False}  # fmt: skip
            out.append(call)
        status = row.status.value
        if STATUS_RANK.get(status, 0) > STATUS_RANK.get(call["status"], 0):
            call["status"] = status
        # by the row's name, not its judged state: a gap's boundary rows are outputs of their call too
        is_output = names[i].startswith(f"{row.api}.{STATE_OUTPUT}")
        if is_output and not call["_outputs"]:
            call["_outputs"], call["max_rel_err"], call["one_minus_cos"] = True, None, None
        elif call["_outputs"] and not is_output:
            continue
        r, c = rel_list[i], cos_list[i]
        if not math.isnan(r):
            call["max_rel_err"] = r if call["max_rel_err"] is None else max(call["max_rel_err"], r)
        if not math.isnan(c):
            gap = max(0.0, 1.0 - c)
            call["one_minus_cos"] = gap if call["one_minus_cos"] is None else max(call["one_minus_cos"], gap)
    for call in out:
        del call["_outputs"]
    return out
