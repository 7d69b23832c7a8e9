"""Row verdicts (compare.md §7.1) and Parity's typed status, without msprobe's verdict bugs.

Fixed on purpose: a ``Nan`` Cosine or MaxAbsErr is ``No`` (msprobe's ``float("Nan")`` made it ``Yes``), an
unmatched row is never ``Yes``/``pass`` (it is ``None``, as msprobe 8.3.3 writes it, status UNMATCHED), and a
0-d tensor whose MaxAbsErr alone already exceeds the hard limit of 1 is ``No`` rather than ``None``.
"""

from __future__ import annotations

from parity.shared.compare.result import Cell, RowStatus

YES = "Yes"
NO = "No"
NONE = "None"
UNMATCHED = "Unmatched"
NA = "N/A"
SHAPE_UNMATCHED = "shape unmatched"
UNSUPPORTED = "unsupported"

COS_THRESHOLD = 0.99
MAX_ABS_ERR_THRESHOLD = 0.001
COS_MAX_THRESHOLD = 0.9
MAX_ABS_ERR_MAX_THRESHOLD = 1.0

#: Err_message fragments the engine adds itself (the tensor-metric ones come from parity.shared.metrics)
MSG_BENCH_UNMATCHED = "Bench api/module unmatched."
MSG_NPU_UNMATCHED = "NPU api/module unmatched: this row exists in the bench dump only."
#: A tensor neither dump saved as a file (a planned dump: files for the listed calls only), judged from its
#: statistics; ``call_errors`` reads the row's error from them on this message.
MSG_STATISTICS_ONLY = "Statistics only: no tensor file on either side (planned dump)."
# msprobe appends its fragments to one another as they are spelled, so the ones that end in a space keep it.
MSG_DTYPE_MISMATCH = "Dtype of NPU and bench do not match. "
MSG_FUZZY = " Fuzzy matching data, the comparison accuracy may be affected."
MSG_REQUIRES_GRAD = "Requires_grad inconsistent. "
MSG_SCALAR_MISMATCH = "The scalar parameters of NPU and Bench are inconsistent. "


def _as_float(cell: Cell) -> float | None:
    """A metric cell as a float, or None for a sentinel string. ``Nan`` is a NaN here, on purpose."""
    if type(cell) is float or type(cell) is int:
        return float(cell)
    if isinstance(cell, str):
        try:
            return float(cell)
        except ValueError:
            return None
    return None


def tensor_accuracy(cosine: Cell, max_abs_err: Cell) -> str:
    """v1's "Accuracy Reached or Not" from Cosine and MaxAbsErr, first rule wins (§7.1)."""
    if cosine == SHAPE_UNMATCHED:
        return UNMATCHED
    if cosine is None or max_abs_err is None or cosine == NONE or max_abs_err == NONE:
        return NONE
    if cosine == NA or max_abs_err == NA:
        return NO
    cos = _as_float(cosine)
    err = _as_float(max_abs_err)
    if (cos is not None and cos != cos) or (err is not None and err != err):
        return NO  # msprobe bug fixed: Nan is float-convertible, and was judged "Yes"
    if cos is None:
        if err is not None and err > MAX_ABS_ERR_MAX_THRESHOLD:
            return NO  # e.g. a 0-d tensor: no cosine, but the error alone fails the hard limit
        return NONE
    if err is None:
        return NONE
    if cos < COS_THRESHOLD and err > MAX_ABS_ERR_THRESHOLD:
        return NO
    if cos < COS_MAX_THRESHOLD or err > MAX_ABS_ERR_MAX_THRESHOLD:
        return NO
    return YES


def tensor_status(accuracy: str) -> RowStatus:
    """The typed status of a matched tensor-mode row from its verdict."""
    if accuracy == YES:
        return RowStatus.PASS
    if accuracy == NO:
        return RowStatus.FAIL
    return RowStatus.UNCOMPARABLE  # "None" (no metric), "Unmatched" (shape)


def escalate(status: RowStatus, to: RowStatus) -> RowStatus:
    """Raise a matched row's status (PASS < WARNING < UNCOMPARABLE < FAIL); unmatched/bench-only stay."""
    order = _ORDER
    if status in (RowStatus.UNMATCHED, RowStatus.BENCH_ONLY):
        return status
    return to if order[to] > order[status] else status


_ORDER = {RowStatus.PASS: 0, RowStatus.WARNING: 1, RowStatus.UNCOMPARABLE: 2, RowStatus.FAIL: 3,
          RowStatus.UNMATCHED: 4, RowStatus.BENCH_ONLY: 4}  # fmt: skip


def join_messages(fragments: list[str], highlight_reasons: frozenset[str] = frozenset()) -> str:
    """Err_message as msprobe 8.3.3 writes it: the compare's fragments appended to one another as spelled
    (``"No bench data matched.Requires_grad inconsistent. "``), then each highlight reason on a line of its
    own (``"\n"``). Unlike msprobe, a fragment or reason repeated for one row is written once (msprobe
    repeats the 0-d message 16 times and a reason once per input row compared)."""
    if len(fragments) == 1:
        return fragments[0]
    unique = dict.fromkeys(fragments)
    body = "".join(f for f in unique if f not in highlight_reasons)
    reasons = [f for f in unique if f in highlight_reasons]
    return "\n".join([body, *reasons] if body else reasons)
