"""msprobe v1's advisor (compare.md §7.3): three lines, ``Line``, ``Suspect Nodes``, ``Expert Advice``.

msprobe names the first failing row and picks a canned hint from its name. Parity's lines come from the same
judgement as its ranked suspects (``localization``): "Suspect Nodes" is the top suspect's worst output row,
and the advice says what the evidence says: msprobe's hint for that row (its texts word for word, so users
who know them read the same advice), the verdict of a float64 replay of that call where one was run
(``ReplayVerdict``: "the target's kernel is wrong"), and the systematic findings (every matmul-class call
differs by ~1e-3: TF32 on the target), which are a difference of the whole device, no call's fault.
``format_advice`` gives the three lines of ``advisor_{ts}.txt``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.localization import Localization
from parity.shared.compare.result import Advice, CompareRow, RowStatus, SystematicFinding
from parity.shared.replay.verdicts import ReplayVerdict, Verdict

NO_ERROR = "NA"
NO_ERR_SUGGEST = "All data in comparison result meets the accuracy requirements."
FORWARD_INPUT_SUGGEST = (
    "1. Analyze the model to view the input source.\n"
    "2. Check whether an inplace API causes the output result to overwrite the input result. That is, the "
    "fault is actually caused by a computation error.\n"
    "3. The fault may be caused by memory corruption and further analysis is required."
)
FORWARD_OUTPUT_SUGGEST = "This is a forward API computation error. Check the computation implementation."
BACKWARD_INPUT_SUGGEST = "Check whether the forward computation result is affected."
BACKWARD_OUTPUT_SUGGEST = "This is a backward API computation error. Check the computation implementation."
DETERMINISTIC_SUGGEST = (
    "This torch api may be uncertainty in the calculation, can seed_all(mode=True) to enable deterministic "
    "computing."
)
#: Parity's: no call stands out, though rows fail msprobe's thresholds (they carry what their inputs had).
NO_SUSPECT_SUGGEST = (
    "No API call's output error stands out beyond what its inputs and its expected rounding explain; the "
    "rows that fail the thresholds carry error from their inputs."
)
#: Parity's: what a systematic finding cannot rule out from the table alone.
SYSTEMATIC_ALTERNATIVE = (
    "If the target should compute these exactly as the bench does, {first} itself may be wrong (its error "
    "carried into the rest): replay it in float64."
)
#: Parity's: a replay showed the bench's kernel is the wrong one.
BENCH_WRONG_SUGGEST = "The bench's result is the wrong one: check the bench run's implementation of this API."
BATCH_NORM_SUGGEST = (
    "Torch API batch_norm input not fixed, the following suggestions may fix it:\n"
    "1. If use torch.nn.functional.batch_norm, you can set parameter training=False.\n"
    "2. If use torch.nn.BatchNormXXX, you can set parameter affine=False.\n"
    "3. Use seed_all(mode=True) to enable deterministic computing."
)
NEED_DETERMINISTIC_API = ("conv2d", "conv3d", "matmul", "nll_loss", "layer_norm", "lstm")
# msprobe keys the batch_norm hint on its legacy underscore names, so it never fires on dotted names; kept
# as msprobe has it so the advice stays identical.
_FUNC_BATCH_NORM = "Functional_batch_norm"
_FORWARD_INPUT_1 = "forward_input.1"

def advice_text(node_name: str) -> str:
    """msprobe's hint for a failing row, by substring tests on its name."""
    if "forward" in node_name:
        if "input" in node_name:
            message = FORWARD_INPUT_SUGGEST
        else:
            message = _deterministic(FORWARD_OUTPUT_SUGGEST, node_name)
    elif "input" in node_name:
        message = BACKWARD_INPUT_SUGGEST
    else:
        message = _deterministic(BACKWARD_OUTPUT_SUGGEST, node_name)
    if _FUNC_BATCH_NORM in node_name and _FORWARD_INPUT_1 in node_name:
        message = BATCH_NORM_SUGGEST
    return message


def _deterministic(message: str, node_name: str) -> str:
    return DETERMINISTIC_SUGGEST if any(api in node_name for api in NEED_DETERMINISTIC_API) else message


def advise(rows: Sequence[CompareRow], names: Sequence[str], mode: CompareMode,
           localization: Localization | None = None,
           replays: Mapping[str, ReplayVerdict] | None = None) -> Advice:  # fmt: skip
    """msprobe's three lines, from the same judgement as the suspects below them.

    With a localization: the top suspect (the output row it points at) with msprobe's hint for it, or what
    a float64 replay of it found (``replays``, by entry name: the replay's seam), then the systematic
    findings; with no suspect, the systematic findings (no node: a whole API class differs), else the
    all-clear, or ``NO_SUSPECT_SUGGEST`` where rows still fail msprobe's thresholds (their values not
    identical: an identical ``-inf`` fill value is no loss of precision). Without a localization,
    msprobe's rule as it stands: the first failing row (its verdict column, or a row Parity's highlight
    rules paint red).
    """
    if localization is not None and localization.suspects:
        top = localization.suspects[0]
        line = top.worst_row if top.worst_row >= 0 else top.first_row
        name = names[line]
        verdict = replays.get(top.api) if replays else None
        replayed = verdict is not None and verdict.verdict is not Verdict.NOT_REPLAYED
        hint = _replayed(name, verdict) if verdict is not None and replayed else advice_text(name)
        text = _with_findings(hint, localization.systematic, replays)
        return Advice(line=line, suspect_node=name, text=text)
    if localization is not None and localization.systematic:
        text = _with_findings("", localization.systematic, replays)
        return Advice(line=None, suspect_node=None, text=text)
    failing_row = _first_failing(rows, localization)
    if failing_row is None:
        return Advice(line=None, suspect_node=None, text=NO_ERR_SUGGEST)
    if localization is not None and mode is not CompareMode.MD5:
        return Advice(line=None, suspect_node=None, text=NO_SUSPECT_SUGGEST)
    name = names[failing_row]
    return Advice(line=failing_row, suspect_node=name, text=advice_text(name))


def _replayed(name: str, verdict: ReplayVerdict) -> str:
    """The advice for a suspect whose float64 replay gave ``verdict``: the verdict, then msprobe's words
    for a computation error when the target's kernel is the wrong one."""
    if verdict.wrong == "target":
        hint = FORWARD_OUTPUT_SUGGEST if "forward" in name else BACKWARD_OUTPUT_SUGGEST
    elif verdict.wrong == "bench":
        hint = BENCH_WRONG_SUGGEST
    else:
        hint = advice_text(name)
    return f"{verdict.text.rstrip('.')}. {hint}"


def _with_findings(text: str, findings: Sequence[SystematicFinding],
                   replays: Mapping[str, ReplayVerdict] | None = None) -> str:  # fmt: skip
    """``text`` followed by each systematic finding, and what decides the one alternative the table cannot
    rule out (a fault in the class's first call, carried into all the others): that call's float64 replay
    where one was run, else the advice to run it."""
    extra = []
    for f in findings:
        verdict = replays.get(f.first) if replays else None
        if verdict is not None and verdict.target.replayed:
            decided = f"The float64 replay of {f.first}: {verdict.text.rstrip('.')}."
        else:
            decided = SYSTEMATIC_ALTERNATIVE.format(first=f.first)
        extra.append(f"Systematic: {f.text}. {decided}")
    return "\n".join(part for part in (text, *extra) if part)


def _first_failing(rows: Sequence[CompareRow], localization: Localization | None) -> int | None:
    """msprobe's failing row: the first whose verdict fails (its verdict column's No, Warning or Different
    fails the row's status) or that a highlight rule paints red, and whose values are not identical on both
    sides (where the localization knows)."""
    fail = RowStatus.FAIL
    errors = localization.errors if localization is not None else None
    for line, row in enumerate(rows):
        if row.status is fail:
            if errors is not None and errors[line] == 0.0:
                continue
            return line
    return None


def format_advice(advice: Advice) -> str:
    """The three lines of msprobe's advisor file: ``Line: …``, ``Suspect Nodes: …``, ``Expert Advice: …``."""
    line = NO_ERROR if advice.line is None else str(advice.line)
    node = advice.suspect_node if advice.suspect_node is not None else NO_ERROR
    return f"Line: {line}\nSuspect Nodes: {node}\nExpert Advice: {advice.text}\n"
