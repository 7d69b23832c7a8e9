"""How far a correct kernel's output may sit from the exact (float64) result: the replay's rounding allowance,
from the compare's one expected-error model (``parity.shared.compare.expected_error``)::

    allowance = REPLAY_SAFETY * u * (1 + ROUNDING_SCALE * sqrt(K))

``u`` is the unit roundoff of the coarsest floating dtype the call wrote (float32: 6.0e-8, float16: 4.9e-4,
bfloat16: 3.9e-3), and ``K`` the length of the call's longest reduction, by the compare's own rules from the
forward entry's recorded shapes and arguments (:func:`reduction_length`): the K the table judged the call
by. The distance the allowance bounds is norm-wise: ``||recorded - replay|| / ||replay||``. (An elementwise
call counts as a 2-term reduction: a few ulps of a transcendental function.)

Measured on the replay tests' model (float32, CPU; ``tests/replay_dumps.py``): correct calls, forward and
backward, sit at 0 to 2.2e-7 from their replay against allowances of 4.3e-6 to 9.3e-6; the injected 1e-2
faults (a forward and a backward gelu) at 8.7e-3 and 1.2e-2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from parity.shared.compare.expected_error import Recorded, op_of, replay_allowance, unit_roundoff
from parity.shared.compare.expected_error import reduction_length as model_length
from parity.shared.replay.arguments import is_tensor_leaf

__all__ = ["recorded_arguments", "reduction_length", "rounding_allowance"]


def rounding_allowance(dtype: torch.dtype, k: int) -> float:
    """The norm-wise relative distance from float64 that rounding in ``dtype`` over ``k`` terms explains."""
    return replay_allowance(unit_roundoff(str(dtype)), k)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _walk(node: Any, name: str, out: dict[str, Recorded]) -> None:
    if is_tensor_leaf(node):
        shape = node.get("shape")
        ok = isinstance(shape, list) and all(isinstance(d, int) for d in shape)
        out[name] = Recorded(tuple(shape) if ok else None)
    elif isinstance(node, dict) and "value" in node:
        value = _number(node["value"])
        out[name] = Recorded((), value) if value is not None else Recorded(None)
    elif isinstance(node, dict):
        for key, value in node.items():
            _walk(value, f"{name}.{key}", out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, f"{name}.{i}", out)


def recorded_arguments(forward: Mapping[str, Any]) -> dict[str, Recorded]:
    """A forward entry's arguments and outputs as the compare names their rows (``input.0``, a list's
    ``input.1.0``, a keyword's ``input.dim``, ``output.0``): shapes, and a scalar's value."""
    out: dict[str, Recorded] = {}
    args, kwargs = forward.get("input_args"), forward.get("input_kwargs")
    for i, value in enumerate(args if isinstance(args, list) else []):
        _walk(value, f"input.{i}", out)
    for key, value in (kwargs if isinstance(kwargs, dict) else {}).items():
        _walk(value, f"input.{key}", out)
    outputs = forward.get("output")
    for i, value in enumerate(outputs if isinstance(outputs, list) else []):
        _walk(value, f"output.{i}", out)
    return out


def reduction_length(entry: str, direction: str, forward: Mapping[str, Any]) -> int:
    """K of the call ``entry`` names, by the compare's own rules (``expected_error.reduction_length``) from
    its forward entry's recorded shapes and arguments: the same K the table judged it by."""
    return model_length(op_of(entry), direction, recorded_arguments(forward))
