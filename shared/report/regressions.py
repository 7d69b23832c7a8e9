"""A comparison's regressions against its baseline as lines of text: what ``parity compare-runs`` prints,
in the words the comparison page uses (``GET /comparisons/{id}/regressions`` is the data).

Light: it needs the REST contract only, so the client's light install prints it too.

Example::

    print("\\n".join(regression_lines(api.regressions(comparison_id))))
"""

from __future__ import annotations

from parity.shared.contract import RegressionsPublic
from parity.shared.numbers import prose_number

#: The verdicts listed as changed since the previous comparison, in the order REST lists them.
CHANGED = ("new", "worse", "fixed")


def regression_lines(regressions: RegressionsPublic, limit: int = 10) -> list[str]:
    """The headline (how many APIs are new, worse, fixed and known), then the first ``limit`` changed APIs,
    new and worse first, each with its error before and after and why; empty when the comparison was not
    against its project's baseline."""
    r = regressions
    if not r.against_baseline:
        return []
    since = (f"since comparison {r.previous_comparison}" if r.previous_comparison
             else "first comparison against this baseline")  # fmt: skip
    counts = f"{r.worse} worse, {r.new} new, {r.fixed} fixed, {r.known} known"
    lines = [f"Against the baseline ({since}): {counts} "
             f"(worse: {r.metric} beyond {prose_number(r.worse_factor)}x)"]  # fmt: skip
    changed = [v for v in r.data if v.verdict in CHANGED]
    for v in changed[:limit]:
        before = "—" if v.before is None else prose_number(v.before)
        after = "—" if v.after is None else prose_number(v.after)
        lines.append(f"  {v.verdict:<5} {v.api}: {before} -> {after}; {v.reason}")
    if len(changed) > limit:
        lines.append(f"  ... and {len(changed) - limit} more")
    return lines
