"""Ranked suspects: the first APIs whose inputs agree but whose outputs do not (where precision is lost).

msprobe's advisor points at the first failing *row*, which is often an input already damaged upstream. A
suspect is an entry whose every input/parameter row is matched and not failing, while some output row fails:
the error appeared inside that call. Forward and backward entries are ranked separately, each in dump order
(the first divergence is the most useful), forward ones first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from parity.shared.compare.result import CompareRow, RowStatus, Suspect
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS

MAX_PER_DIRECTION = 5
_BAD_INPUT = frozenset({RowStatus.FAIL, RowStatus.UNMATCHED})


def direction_of(api: str) -> str | None:
    """``forward``/``backward`` from an entry name (APIs: count then direction; modules: the other way)."""
    tokens = api.split(".")
    if "backward" in tokens[-2:]:
        return "backward"
    if "forward" in tokens[-2:]:
        return "forward"
    return None


def forward_name(api: str) -> str:
    """The forward entry of a backward one, whose stack stack.json holds (only forwards have stacks)."""
    tokens = api.split(".")
    for k in (-1, -2):
        if len(tokens) >= -k and tokens[k] == "backward":
            tokens[k] = "forward"
            return ".".join(tokens)
    return api


def find_suspects(
    rows: Sequence[CompareRow],
    states: Sequence[str],
    disagree: Sequence[bool],
    reason_of: Callable[[int], str],
    stacks: Mapping[str, list[str]] | None = None,
    *,
    limit: int = MAX_PER_DIRECTION,
) -> list[Suspect]:
    """Suspects from the finished table: ``disagree[i]`` marks a failing row, ``reason_of(i)`` says why
    (a callable, so only the few suspects' rows pay for the text)."""
    found: dict[str, list[tuple[str, int]]] = {"forward": [], "backward": []}
    n = len(rows)
    # Only an entry with a disagreeing output row can be a suspect: visit just those, in table order.
    stop = 0
    for candidate in [i for i, bad in enumerate(disagree) if bad]:
        if candidate < stop or states[candidate] != STATE_OUTPUT:
            continue
        api = rows[candidate].api
        start = candidate
        while start > 0 and rows[start - 1].api == api:
            start -= 1
        stop = candidate + 1
        while stop < n and rows[stop].api == api:
            stop += 1
        direction = direction_of(api)
        if direction is None or len(found[direction]) >= limit:
            continue
        first_bad_output = -1
        inputs_agree = True
        for i in range(start, stop):
            state = states[i]
            if state in (STATE_INPUT, STATE_PARAMETERS):
                if rows[i].status in _BAD_INPUT or disagree[i]:
                    inputs_agree = False
                    break
            elif state == STATE_OUTPUT and first_bad_output < 0 and disagree[i]:
                first_bad_output = i
        if inputs_agree and first_bad_output >= 0 and rows[start].status is not RowStatus.BENCH_ONLY:
            found[direction].append((api, first_bad_output))
    suspects: list[Suspect] = []
    for direction in ("forward", "backward"):
        for api, row_index in found[direction]:
            frames = None
            if stacks:
                frames = stacks.get(api) or stacks.get(forward_name(api))
            suspects.append(Suspect(
                rank=len(suspects) + 1, api=api, direction=direction, row_index=row_index,
                reason=reason_of(row_index), stack=frames[0] if frames else None,
            ))  # fmt: skip
    return suspects
