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
