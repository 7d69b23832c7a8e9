"""Regressions against a baseline: each API judged new, worse, known or fixed by its error (``judge``, the
one rule the server's ``GET /comparisons/{id}/regressions`` and a local ``parity check`` apply), and the
lines of text ``parity compare-runs`` and ``parity check`` print, in the words the comparison page uses.

Light: it needs the REST contract only, so the client's light install prints it too.

The rule, against the previous comparison with the same bench run and the notes that accepted an API:

* **new**: it fails now, passed before (or there was no comparison before) and was not accepted;
* **worse**: it failed before or was accepted, and its error grew beyond :data:`WORSE_FACTOR` times the
  level it had when accepted, or (not accepted) the error before: a regression hiding behind a known failure
  (also when it passes msprobe's thresholds now: a 3.57x growth is no fix);
* **fixed**: it passes now and its error dropped below the level accepted (or the error before) by
  :data:`WORSE_FACTOR` (or to zero);
* **known**: the rest: failing before or accepted, its error within :data:`WORSE_FACTOR` of what it is judged
  against (passing now by a hair is known, not fixed).

Example::

    print("\\n".join(regression_lines(api.regressions(comparison_id))))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from parity.shared.contract import ApiVerdict, RegressionsPublic
from parity.shared.numbers import prose_number

#: An API failing before (or accepted) is ``worse`` once its error exceeds this many times the error of the
#: previous comparison against the same baseline, or the level it had when accepted; one passing now is
#: ``fixed`` once its error is this many times below it. Nightly drift under a changed dtype moves errors
#: by well under 2x between runs; a real regression moves them by 10x and more.
WORSE_FACTOR = 3.0

#: The order verdicts are listed in: what changed for the worse first.
_VERDICT_ORDER = {"new": 0, "worse": 0, "known": 1, "fixed": 2}


class Accepted(Protocol):
    """An acceptance as :func:`judge` reads it (the server's ``ApiAcceptance`` row)."""

    level: float | None
    note: str
    accepted_by: str
    author: str | None


def judge_apis(failing: Sequence[str], now: Mapping[str, float | None], before_failing: Sequence[str],
               then: Mapping[str, float | None], *, order: Mapping[str, int] | None = None,
               accepted: Mapping[str, Accepted] | None = None, stacks: Mapping[str, str] | None = None,
               against_baseline: bool = True,
               previous_comparison: str | None = None) -> RegressionsPublic:  # fmt: skip
    """Every API failing now (``failing``, errors ``now``) or in the previous comparison (``before_failing``,
    errors ``then``) judged by :func:`judge`: new and worse first, each group in execution order (``order``:
    an API's place; APIs without one after the others, as listed)."""
    accepted = accepted or {}
    stacks = stacks or {}
    failed_before, failing_now = set(before_failing), set(failing)
    listed = list(dict.fromkeys([*failing, *before_failing]))
    if order is not None:
        listed.sort(key=lambda api: order.get(api, len(order)))
    verdicts = [judge(api, now.get(api), then.get(api), api in failed_before, accepted.get(api),
                      failing_now=api in failing_now, stack=stacks.get(api)) for api in listed]  # fmt: skip
    verdicts.sort(key=_listing_order)  # stable: execution order within each group
    count = {v: sum(x.verdict == v for x in verdicts) for v in ("new", "worse", "known", "fixed")}
    return RegressionsPublic(against_baseline=against_baseline, previous_comparison=previous_comparison,
                             data=verdicts, worse_factor=WORSE_FACTOR, **count)  # fmt: skip



def summary_stacks(summary: Mapping[str, Any]) -> dict[str, str]:
    """``api -> stack line`` of the comparison's suspects (every rank's, and each first divergence), from
    its stored summary document: the line in the user's code that a regression's report names."""
    found: dict[str, str] = {}
    ranks = summary.get("ranks") or [summary]
    for doc in ranks:
        if not isinstance(doc, dict):
            continue
        for suspect in [*(doc.get("suspects") or []), doc.get("first_divergence")]:
            if isinstance(suspect, dict) and suspect.get("stack") and suspect.get("api"):
                found.setdefault(str(suspect["api"]), str(suspect["stack"]))
    return found


def judge(api: str, after: float | None, before: float | None, failed_before: bool, note: Accepted | None,
          *, failing_now: bool = True, stack: str | None = None) -> ApiVerdict:  # fmt: skip
    """One API's verdict by its error (see the module's docstring), with the reason in words."""
    level = note.level if note is not None else None
    # An acceptance accepts a level: judged against it (the error may have grown since the previous
    # comparison, which is what was accepted); otherwise against the previous comparison.
    reference, what = (level, "the level accepted") if level is not None else \
        (before if failed_before else None, "the previous comparison")  # fmt: skip
    growth, against = None, ""
    if after is not None and reference is not None and reference > 0:
        growth, against = after / reference, f"{prose_number(reference)} of {what}"
    factor = prose_number(WORSE_FACTOR)
    if failing_now and not failed_before and note is None:
        verdict = "new"
        growth = after / before if after is not None and before else None
        reason = (f"failing now ({_err(after)}), passing in the previous comparison ({_err(before)})"
                  if before is not None else f"failing ({_err(after)}); no earlier comparison had it failing")
    elif growth is not None and growth > WORSE_FACTOR:
        verdict = "worse"
        passing = "" if failing_now else "passing msprobe's thresholds now, but "
        reason = f"{passing}{_err(after)}, {prose_number(growth)}x the {against} (worse beyond {factor}x)"
    elif not failing_now and after is not None and reference is not None and \
            (after == 0 or (reference > 0 and after * WORSE_FACTOR <= reference)):  # fmt: skip
        verdict = "fixed"
        reason = (f"passing now ({_err(after)}), below the {against} by {factor}x or more" if after
                  else f"passing now, its error zero ({_err(before)} in the previous comparison)")
    else:
        verdict = "known"
        if not failing_now:
            reason = ("passing now, but its error is unknown: not judged fixed" if after is None or
                      reference is None else f"passing now ({_err(after)}), but within {factor}x of the "
                      f"{against}: not judged fixed")  # fmt: skip
        elif level is not None:
            reason = f"accepted with a note at {_err(level)}; {_err(after)} now"
        elif failed_before:
            reason = f"failing in the previous comparison too ({_err(before)} then, {_err(after)} now)"
        else:
            reason = f"accepted with a note; {_err(after)} now"
    return ApiVerdict(
        api=api, verdict=verdict, failed_before=failed_before, before=before, after=after, growth=growth,  # type: ignore[arg-type]
        accepted_level=level, reason=reason, note=note.note if note else None,
        accepted_by=note.accepted_by if note else None, author=note.author if note else None,
        failing=failing_now, stack=stack,
    )  # fmt: skip


def _err(value: float | None) -> str:
    return "error unknown" if value is None else f"max relative error {prose_number(value)}"


def _listing_order(v: ApiVerdict) -> int:
    """New and worse first, then known, then fixed (within each, execution order: the first call that got
    worse is where a regression starts, the calls after it carry it on)."""
    return _VERDICT_ORDER[v.verdict]


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
