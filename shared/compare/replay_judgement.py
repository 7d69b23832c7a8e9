"""The float64 replay inside the one judgement (tensor mode): which calls to replay, and how their verdicts
re-rank the suspects, so the ranked list, msprobe's three advisor lines and the replay section agree.

The table judges a call by its output error against what its inputs carry, its rounding and the pair's
background. Across devices that misses two kinds of fault: a call whose own error is no bigger than what a
lower-precision matmul class carries into it (an fp16-internal norm on a TF32 target), and a fault in the
first call of a class that carries into every later call (it reads as a systematic finding). A replay from
each side's own recorded inputs sees both: the faulty call's recorded output is far from its own float64
replay, while a correct call is within its rounding.

Candidates (bounded: at most ``limit + 1 + HELD_LIMIT``, plus ``1 + 2 * CLASS_SAMPLES`` per systematic
finding, each replay capped by the replay's own element and flop caps, ``parity.shared.replay.engine``):

* the ``limit`` calls with the highest table score, below the suspect threshold too, that compute (a copy,
  view or cast, ``_NO_ARITHMETIC``, is the table's own check again);
* the first divergence;
* each systematic finding's first call (the one that would be a fault), and CLASS_SAMPLES more calls of its
  class in each direction, whose replays give the level the class differs by on the target;
* the first HELD_LIMIT calls (in execution order) the held-format screen names (``held_screen``: a float32
  output whose recorded max and min are float16 or bfloat16 values while its inputs' are not), whatever their
  table score: a float16 kernel on a TF32 target can rank among the last by its error, while the replay's
  held-format check names it at once.

Each verdict's target side is then judged against its expected level, not rounding alone: the replay's
allowance (``expected_error.replay_allowance``), the pair's noise floor and its class's level (the median of
the other replayed calls of its class and direction; the systematic finding's where fewer were replayed),
the last two times LEVEL_MARGIN (a correct call's distance spreads about its class's level). A call whose
target is wrong beyond that, and whose bench is right, is a suspect ahead of every table suspect (by how far
beyond, in decades); the others keep the table's order. A systematic finding whose first call is such a
suspect, while the class's other calls replay within its level, is that call's fault carried on: withdrawn.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from parity.shared.compare.expected_error import op_of
from parity.shared.compare.headers import CompareMode
from parity.shared.compare.localization import (
    INFINITE_SCORE,
    CallEvidence,
    Localization,
    first_divergence,
    suspect_score,
)
from parity.shared.compare.result import SystematicFinding
from parity.shared.errors import ParityError
from parity.shared.replay.verdicts import ReplayVerdict, Verdict, verdict_of

__all__ = [
    "CLASS_SAMPLES", "HELD_LIMIT", "LEVEL_MARGIN", "Replayer", "candidates", "judge_with_replay", "rejudge",
]  # fmt: skip

logger = logging.getLogger(__name__)

#: ``replayer(entries[, partners])``: each entry's verdict (``parity.shared.replay.compare.dump_replayer``);
#: ``partners`` names the bench call of an entry the alignment paired under another name (``""``: a gap);
#: raises ``ParityError`` when a dump.json cannot be read.
Replayer = Callable[..., Sequence[ReplayVerdict]]
#: Calls of a systematic class replayed beside its first, per direction, to learn the class's level.
CLASS_SAMPLES = 3
#: Calls the held-format screen adds to the replay, at most (the earliest: a fault's first call is the one
#: to find, and a table with many held outputs, a model run in half precision on one side, needs no more).
HELD_LIMIT = 8
#: A correct call's distance from its replay spreads about its class's level (TF32 matmuls of one model: 0.5x
#: to 2x the median) and the pair's floor: beyond this many times them the call's kernel is wrong.
LEVEL_MARGIN = 3.0
NO_TENSORS_NOTE = "{mode} mode: no float64 replay (the dumps hold no tensors)"
_UNREPLAYABLE = ("Module.", "Distributed.")
#: Calls that move or copy data and compute nothing: their replay is the table's own check again (the output
#: is the input), so they take no place among the candidates.
_NO_ARITHMETIC = frozenset((
    "detach clone contiguous view view_as reshape flatten split chunk unbind narrow select squeeze unsqueeze "
    "transpose permute t expand expand_as getitem cat concat stack to float double half type_as copy_ "
    "zero_ fill_ masked_fill"
).split())


def _replayable(api: str) -> bool:
    return not api.startswith(_UNREPLAYABLE) and op_of(api) not in _NO_ARITHMETIC


def candidates(loc: Localization, limit: int) -> list[str]:
    """The entries to replay, in the order above (each once)."""
    judged = loc.judged
    apis, classes, directions = judged.columns.apis, judged.classes, judged.directions
    picked: dict[str, None] = {}
    scores = judged.score
    for k in np.argsort(-scores, kind="stable").tolist():
        if len(picked) >= limit or not scores[k] > -math.inf:
            break
        if _replayable(apis[k]):
            picked.setdefault(apis[k])
    if loc.first_divergence is not None and _replayable(loc.first_divergence.api):
        picked.setdefault(loc.first_divergence.api)
    for finding in loc.systematic:
        picked.setdefault(finding.first)
        for direction in ("forward", "backward"):
            members = [a for a, c, d in zip(apis, classes, directions, strict=True)
                       if c == finding.api_class and d == direction and a != finding.first and _replayable(a)]
            for api in members[:CLASS_SAMPLES]:
                picked.setdefault(api)
    held = [apis[k] for k in np.flatnonzero(judged.held).tolist() if _replayable(apis[k])]
    for api in held[:HELD_LIMIT]:
        picked.setdefault(api)
    return list(picked)


def _levels(verdicts: Sequence[ReplayVerdict], class_of: Mapping[str, str]) -> dict[str, float]:
    """Each verdict's class level: the median target distance of the other replayed calls of its class and
    direction (NaN where fewer than two were replayed). A call whose bench output is its float64 replay
    exactly rounded nothing (a 3-D linear's recorded backward is its view's, handing on its incoming
    gradient): it says nothing of the level its class's kernels compute at, and would pull it to zero."""
    groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for v in verdicts:
        d = v.target.distance
        if v.bench.distance == 0.0:
            continue
        if d is not None and math.isfinite(d) and v.entry in class_of:
            groups.setdefault((class_of[v.entry], v.direction), []).append((v.entry, d))
    out: dict[str, float] = {}
    for v in verdicts:
        others = [d for e, d in groups.get((class_of.get(v.entry, ""), v.direction), []) if e != v.entry]
        out[v.entry] = float(np.median(others)) if len(others) >= 2 else math.nan
    return out


def rejudge(loc: Localization, verdicts: Sequence[ReplayVerdict]) -> tuple[Localization, list[ReplayVerdict]]:
    """The localization re-ranked by the replay's verdicts (see the module docstring), and the verdicts
    with each target side judged against its expected level."""
    judged = loc.judged
    index = {api: k for k, api in enumerate(judged.columns.apis)}
    class_of = {v.entry: judged.classes[index[v.entry]] for v in verdicts if v.entry in index}
    levels = _levels(verdicts, class_of)
    found = {f.api_class: f.level for f in loc.systematic}
    out: list[ReplayVerdict] = []
    confirmed: dict[int, float] = {}
    for v in verdicts:
        k = index.get(v.entry)
        t = v.target
        if k is None or t.distance is None or t.allowance is None:
            out.append(v)
            continue
        level = levels[v.entry]
        if math.isnan(level):
            level = found.get(class_of[v.entry], 0.0)
        floor = float(judged.floor[k]) if judged.floor.size else 0.0
        allowance = math.hypot(t.allowance, LEVEL_MARGIN * level, LEVEL_MARGIN * floor)
        side = dataclasses.replace(t, allowance=allowance, level=level or None)
        judged_v = verdict_of(v.entry, v.direction, side, v.bench, asked=v.asked, arguments=v.arguments,
                              identical=v.identical)  # fmt: skip
        out.append(judged_v)
        if judged_v.verdict is Verdict.ARGUMENTS:  # the cause, however little it shows in the table
            confirmed[k] = max(float(judged.score[k]), suspect_score(loc.mode))
        elif judged_v.verdict is Verdict.TARGET and not math.isnan(judged.columns.output_err[k]):
            assert t.distance is not None
            beyond = math.log10(t.distance / allowance) if math.isfinite(t.distance) else INFINITE_SCORE
            confirmed[k] = max(beyond, suspect_score(loc.mode)) if t.held else beyond
    by_entry = {v.entry: v for v in out}
    ranked = [_with_replay(judged.evidence(k), by_entry, confirmed[k])
              for k in sorted(confirmed, key=lambda k: (-confirmed[k], k))]
    for k, score in confirmed.items():
        judged.score[k] = max(float(judged.score[k]), score)
    ranked += [_with_replay(c, by_entry) for c in loc.suspects if c.order not in confirmed]
    systematic = [f for f in loc.systematic if not _carried(f, index, confirmed, by_entry)]
    first = first_divergence(judged.input_err, ranked) if ranked else None
    return dataclasses.replace(loc, suspects=ranked, first_divergence=first, systematic=systematic), out


def _with_replay(call: CallEvidence, by_entry: Mapping[str, ReplayVerdict],
                 score: float | None = None) -> CallEvidence:  # fmt: skip
    verdict = by_entry.get(call.api)
    changes: dict[str, Any] = {"replay": verdict.text} if verdict is not None else {}
    if score is not None:
        changes["replay_score"] = score
    return dataclasses.replace(call, **changes) if changes else call


def _carried(finding: SystematicFinding, index: Mapping[str, int], confirmed: Mapping[int, float],
             by_entry: Mapping[str, ReplayVerdict]) -> bool:  # fmt: skip
    """The finding is its first call's fault carried on: that call is wrong beyond its class's level, and
    the class's other replayed calls sit within a LEVEL_MARGIN-th of the finding's level."""
    first = by_entry.get(finding.first)
    if index.get(finding.first) not in confirmed or first is None:
        return False
    return (first.target.level or 0.0) * LEVEL_MARGIN < finding.level


def _shown(loc: Localization, verdicts: Sequence[ReplayVerdict], limit: int) -> list[dict[str, object]]:
    """The verdicts the replay section shows, in the ranked list's order: the suspects', the first
    divergence's, then each systematic finding's first call's."""
    by_entry = {v.entry: v for v in verdicts}
    order = [c.api for c in loc.suspects[:limit]]
    if loc.first_divergence is not None:
        order.append(loc.first_divergence.api)
    order += [f.first for f in loc.systematic]
    return [by_entry[e].as_dict() for e in dict.fromkeys(order) if e in by_entry]


Judged = tuple[Localization, dict[str, Any] | None, dict[str, ReplayVerdict]]


def _requests(loc: Localization, entries: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Of ``entries``: those whose target asked for other arguments (with them in words: the replay asks
    the target's inputs what the bench asked too), and those whose inputs agree on both sides."""
    judged = loc.judged
    index = {api: k for k, api in enumerate(judged.columns.apis)}
    words = judged.choices.arguments if judged.choices is not None else {}
    asked = {e: "; ".join(words[index[e]]) for e in entries if index.get(e) in words}
    identical = [e for e in entries if e in index and judged.input_err[index[e]] == 0.0]
    return asked, identical


def judge_with_replay(loc: Localization, replayer: Replayer | None, limit: int,
                      partners: Mapping[str, str] | None = None) -> Judged:  # fmt: skip
    """The localization after the replay, the summary's ``replay`` document, and the verdicts by entry
    (the advisor's). Statistics and md5 dumps hold no tensors: the note says so. The replay never fails a
    compare: a dump.json it cannot read becomes the note."""
    if replayer is None or limit <= 0:
        return loc, None, {}
    if loc.mode is not CompareMode.TENSOR:
        return loc, {"verdicts": [], "note": NO_TENSORS_NOTE.format(mode=loc.mode.value)}, {}
    entries = candidates(loc, limit)
    if not entries:
        return loc, {"verdicts": [], "note": "no call to replay", "replayed": 0}, {}
    try:
        wanted = {e: partners[e] for e in entries if e in partners} if partners else {}
        asked, identical = _requests(loc, entries)
        extra: dict[str, Any] = {"asked": asked, "identical": identical} if asked or identical else {}
        verdicts = list(replayer(entries, wanted, **extra) if wanted or extra else replayer(entries))
    except ParityError as exc:
        logger.warning("float64 replay not run: %s", exc)
        return loc, {"verdicts": [], "note": f"not run: {exc}"}, {}
    loc, judged = rejudge(loc, verdicts)
    doc = {"verdicts": _shown(loc, judged, limit), "note": None, "replayed": len(judged)}
    return loc, doc, {v.entry: v for v in judged}
