"""Slices of one rank's compare: the API calls of a rank too large for one task, split into K parts.

Slice ``k`` of ``K`` takes the NPU dump's calls ``[k*n//K, (k+1)*n//K)`` in execution (dump) order, ``n`` the
number of calls: the bounds depend on ``n`` and ``K`` only, so a slice run again reads the same calls. A call
(one dump entry: a forward and its backward are two) is never split, so every rule that reads the rows of
one call (the highlights) sees them together. The engine builds a slice's rows as the whole compare would
(``engine.compare_part``); ``engine.conclude`` joins the parts of every slice, in order, and runs what needs
the whole rank (localization, advice, suspects).

A part travels between tasks as MessagePack (``encode_part``/``decode_part``): lossless for every cell
(NaN and infinities stay floats), typed on the way back, and no code runs when it is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from parity.shared.compare.facts import RowFacts
from parity.shared.compare.result import CompareRow
from parity.shared.errors import CompareInputError


@dataclass(frozen=True, slots=True)
class CallSlice:
    """Slice ``index`` of ``count`` of a rank's calls (the default, 0 of 1, is every call)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise CompareInputError(f"slice {self.index} of {self.count}: expected 0 <= slice < slices")

    def calls(self, n: int) -> tuple[int, int]:
        """The ``[first, stop)`` call indexes of this slice among ``n`` calls."""
        return self.index * n // self.count, (self.index + 1) * n // self.count

    def rows(self, apis: Sequence[str]) -> tuple[int, int, tuple[int, int, int]]:
        """The ``[start, stop)`` rows of this slice, for rows whose call is ``apis[i]`` (consecutive rows of a
        call share it), and ``(first call, stop call, n calls)``."""
        starts = [i for i in range(len(apis)) if i == 0 or apis[i] != apis[i - 1]]
        n = len(starts)
        first, stop = self.calls(n)
        row_at = starts + [len(apis)]
        return row_at[first], row_at[stop], (first, stop, n)


class TablePart(msgspec.Struct, gc=False):
    """The finished rows of one slice of a rank, with what ``engine.conclude`` needs besides them."""

    mode: str  # CompareMode's value
    stack_mode: bool
    rows: list[CompareRow]
    states: list[str]  # per row: the leaf's state (input, output, parameter, ...), for the localization
    missing_tensor_files: list[str]
    calls: tuple[int, int, int]  # (first call, stop call, calls of the rank)
    #: the gaps judged as one call (calls without a partner: ``alignment.Gap``), by that call: their labels
    gaps: dict[str, str] = {}
    #: the bench call of each call paired under another name (``""``: a gap's call), for the float64 replay
    partners: dict[str, str] = {}
    #: the innermost module of each call (construct.json, at mix), for the modules' expected rounding
    parents: dict[str, str] = {}
    #: the rows' typed facts, in row order (what the judgement reads; the cells are the display)
    facts: RowFacts | None = None


def _plain_number(value: object) -> object:
    """A NumPy scalar cell as the Python number it holds (MessagePack knows no NumPy types)."""
    item = getattr(value, "item", None)
    if item is None:
        raise TypeError(f"a cell of type {type(value).__name__} cannot be encoded")
    return item()


_encoder = msgspec.msgpack.Encoder(enc_hook=_plain_number)
_decoder = msgspec.msgpack.Decoder(TablePart)


def encode_part(part: TablePart) -> bytes:
    return _encoder.encode(part)


def decode_part(data: bytes, *, source: str = "part") -> TablePart:
    """The part ``encode_part`` wrote; a ``CompareInputError`` naming ``source`` if it is not one."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CompareInputError(f"{source}: not a slice's rows ({exc})") from None
