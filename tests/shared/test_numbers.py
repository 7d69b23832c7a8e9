"""Numbers in prose (``shared.numbers``): 3 significant digits in every sentence, tables untouched."""

from __future__ import annotations

import math

import numpy as np
from parity.shared.contract import SuspectPublic
from parity.shared.numbers import prose_number


def test_three_significant_digits_for_floats_and_numeric_text() -> None:
    assert prose_number(0.056832827929086074) == "0.0568"
    assert prose_number("0.056832827929086074%") == "0.0568%"
    assert prose_number(np.float32(1.23456e-5)) == "1.23e-05"
    assert prose_number(40.4123) == "40.4"
    assert prose_number(3.0) == "3"


def test_what_is_not_a_rounded_number_stays_as_it_is() -> None:
    assert prose_number(12) == "12" and prose_number("12") == "12"  # counts are exact
    assert prose_number("N/A") == "N/A" and prose_number("unsupported") == "unsupported"
    assert prose_number(math.inf) == "inf" and prose_number("nan%") == "nan%"
    assert prose_number(None) == "None" and prose_number(True) == "True"


def test_a_suspects_place_is_its_position_and_old_summaries_still_read() -> None:
    fields = {"api": "A.0.forward", "direction": "forward", "row_index": 3, "reason": "r", "stack": None,
              "compare_rank": 2}  # fmt: skip
    assert SuspectPublic.model_validate({**fields, "position": 1}).position == 1
    old = SuspectPublic.model_validate({**fields, "rank": 4})  # stored before the field was renamed
    assert old.position == 4 and old.compare_rank == 2
    assert "rank" not in SuspectPublic.model_validate({**fields, "position": 1}).model_dump()


def test_regression_lines_put_what_changed_first() -> None:
    from parity.shared.contract import ApiVerdict, RegressionsPublic
    from parity.shared.report.regressions import regression_lines

    data = [
        ApiVerdict(api="F.gelu.1.forward", verdict="worse", failed_before=True, before=0.00127, after=0.0513,
                   growth=40.4, reason="max relative error 0.0513, 40.4x the 0.00127"),
        ApiVerdict(api="F.linear.0.forward", verdict="known", failed_before=True, before=0.002, after=0.002),
        ApiVerdict(api="F.relu.0.forward", verdict="fixed", failed_before=True, before=0.2, after=0.0),
    ]  # fmt: skip
    r = RegressionsPublic(against_baseline=True, previous_comparison="c1", data=data, new=0, known=1, worse=1,
                          fixed=1, worse_factor=3.0)  # fmt: skip
    lines = regression_lines(r)
    assert lines[0] == ("Against the baseline (since comparison c1): 1 worse, 0 new, 1 fixed, 1 known "
                        "(worse: max relative error beyond 3x)")  # fmt: skip
    assert lines[1].startswith("  worse F.gelu.1.forward: 0.00127 -> 0.0513; max relative error 0.0513")
    assert lines[2].startswith("  fixed F.relu.0.forward: 0.2 -> 0;") and len(lines) == 3  # known: not listed
    other = RegressionsPublic(against_baseline=False, previous_comparison=None, data=[], new=0, known=0)
    assert regression_lines(other) == []
