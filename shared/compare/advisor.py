"""msprobe v1's advisor (compare.md §7.3): the first failing row and a canned hint chosen from its name.

The texts are msprobe's, word for word, so users who know them read the same advice; ``format_advice`` gives
the three lines of ``advisor_{ts}.txt``.
"""

from __future__ import annotations

from collections.abc import Sequence

from parity.shared.compare.headers import CompareMode
from parity.shared.compare.localization import Localization
from parity.shared.compare.result import Advice, CompareRow, RowStatus

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

#: the verdict that makes a row "failing" for the advisor, per mode, and its column
FAILING_VERDICT = {
    CompareMode.TENSOR: ("Accuracy Reached or Not", "No"),
    CompareMode.STATISTICS: ("Result", "Warning"),
    CompareMode.MD5: ("Result", "Different"),
}


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


def advise(rows: Sequence[CompareRow], header: Sequence[str], mode: CompareMode,
           localization: Localization | None = None) -> Advice:  # fmt: skip
    """msprobe's three lines, from the same judgement as the suspects below them.

    With a localization: its first divergence (the output row it points at) when there is one; otherwise
    the first failing row (msprobe's rule: its verdict column, or a row Parity's highlight rules paint red)
    whose values are not identical on both sides (an identical ``-inf`` fill value is no loss of precision);
    otherwise the all-clear. Without one, msprobe's rule as it stands.
    """
    name_col = header.index("NPU Name")
    if localization is not None and localization.first_divergence is not None:
        first = localization.first_divergence
        line = first.worst_row if first.worst_row >= 0 else first.first_row
        name = str(rows[line].cells[name_col])
        return Advice(line=line, suspect_node=name, text=advice_text(name))
    column, failing = FAILING_VERDICT[mode]
    verdict_col = header.index(column)
    fail = RowStatus.FAIL
    errors = localization.errors if localization is not None else None
    for line, row in enumerate(rows):
        if row.cells[verdict_col] == failing or row.status is fail:
            if errors is not None and errors[line] == 0.0:
                continue
            name = str(row.cells[name_col])
            return Advice(line=line, suspect_node=name, text=advice_text(name))
    return Advice(line=None, suspect_node=None, text=NO_ERR_SUGGEST)


def format_advice(advice: Advice) -> str:
    """The three lines of msprobe's advisor file: ``Line: …``, ``Suspect Nodes: …``, ``Expert Advice: …``."""
    line = NO_ERROR if advice.line is None else str(advice.line)
    node = advice.suspect_node if advice.suspect_node is not None else NO_ERROR
    return f"Line: {line}\nSuspect Nodes: {node}\nExpert Advice: {advice.text}\n"
