"""Numbers in prose: one formatter for every sentence Parity writes (suspect reasons, regressions, pages).

Tables keep full precision (the xlsx report and the rows endpoint are msprobe's cells, read by scripts); a
sentence shows 3 significant digits, so "MaxRelativeErr 0.0568%" reads at a glance where
"0.056832827929086074%" did not.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

#: Significant digits of a number in a sentence.
PROSE_DIGITS = 3


def prose_number(value: object) -> str:
    """``value`` for a sentence: a float to :data:`PROSE_DIGITS` significant digits (``0.0568``,
    ``1.23e-05``), a numeric text such as msprobe's ``"0.056832827929086074%"`` likewise (``"0.0568%"``);
    integers, non-finite values and other text as they are."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        number = float(value)
        return f"{number:.{PROSE_DIGITS}g}" if math.isfinite(number) else str(number)
    if isinstance(value, str):
        text = value.strip()
        body, percent = (text[:-1], "%") if text.endswith("%") else (text, "")
        try:
            number = float(body)
        except ValueError:
            return value
        if not math.isfinite(number) or body.lstrip("+-").isdigit():
            return value
        return f"{number:.{PROSE_DIGITS}g}{percent}"
    return str(value)


def listed(values: list[int], what: str | None = None) -> str:
    """Steps or ranks as a list, never read as a count: ``0``, ``0, 2``, ``0-7`` (``what="step"``: ``step 0``,
    ``steps 0, 2``, ``steps 0-7``); ``none`` (``no steps``) for none."""
    if not values:
        return f"no {what}s" if what else "none"
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        text, many = f"{values[0]}-{values[-1]}", True
    else:
        text, many = ", ".join(map(str, values)), len(values) > 1
    return f"{what}{'s' if many else ''} {text}" if what else text
