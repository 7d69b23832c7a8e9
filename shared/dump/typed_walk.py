"""The fast path of the dump reader: dump.json decoded by msgspec straight into typed records, then walked.

Parsing a dump into dicts and walking them cost ~4.5 µs a row, most of it building a dict per leaf and looking
its keys up again. msgspec decodes the same text into slotted records in C, checking the field types as it
goes: about 3x faster than a parse into dicts, and the walk over the records needs no dict lookup and few
checks. Measured on the benchmark's 60k-row dump: 0.28 s a side read the classic way, about 0.12 s this way.

The fast path is exact by construction. It accepts a subset of the documents the classic reader accepts and
yields the same columns for each of them:

- msgspec decodes only valid JSON, and gives the values ``json`` gives: the same strings, ints of any size,
  and correctly rounded floats (checked against ``json`` on 300k random and halfway-case numbers in the
  tests). What it refuses (a number out of range, a lone surrogate, a byte-order mark) is left to the
  classic reader.
- The bare ``NaN`` / ``Infinity`` / ``-Infinity`` tokens msprobe writes are not JSON. They are quoted
  before decoding (``"NaN"``). A token that stood inside a string cannot be quoted into valid JSON: the new
  quote would end the string and leave the token bare. So in a document that still decodes, each quoted
  token came from a bare one, unless the file escapes a letter (``"\u004eaN"`` is the text NaN too): such a
  file is left to the classic reader. Each token is turned back into its float where a statistic or a
  scalar value holds it. If any is left over, somewhere else, the classic reader reads the file.
- An entry whose name holds ``parameters_grad`` is a container of its own; if the file spells such a name
  with an escape, the bytes do not show it and the classic reader reads the file.
- A record holds every field the walker reads, each defaulting to ``UNSET``. A leaf outside the hot case is
  turned back into the dict the classic walker would have seen, missing keys still missing, and walked
  exactly as before.
- Anything the schema does not describe gives up on the file: a nested object that is not a leaf, a
  ``P2POp``, a leaf or an entry of the wrong type, any ``DumpError``. ``walk_typed`` then returns None and
  the caller reads the file the classic way, errors and their messages included.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from itertools import repeat
from pathlib import Path
from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType
from parity.shared.dump.columns import STATE_INPUT, STATE_OUTPUT, STATE_PARAMETERS, STATE_PARAMETERS_GRAD
from parity.shared.dump.walker import NONE4, LeafWalker
from parity.shared.errors import DumpError

logger = logging.getLogger(__name__)


class LeafRecord(msgspec.Struct, gc=False):
    """A leaf of dump-format.md §4.3, as the walker reads it. Absent fields stay ``UNSET``, so the dict the
    classic walker would have seen can be rebuilt exactly (``as_dict``)."""

    type: str
    dtype: str | None | UnsetType = UNSET
    shape: tuple | UnsetType = UNSET  # type: ignore[type-arg]  # a tuple: hashable, so shape texts are cached
    Max: Any = UNSET
    Min: Any = UNSET
    Mean: Any = UNSET
    Norm: Any = UNSET
    requires_grad: bool | None | UnsetType = UNSET
    md5: str | None | UnsetType = UNSET
    data_name: str | None | UnsetType = UNSET
    value: Any = UNSET
    group_ranks: Any = UNSET
    format: Any = UNSET
    tensor_stat_index: Any = UNSET


#: what a container holds: a leaf, a null, or a nested list (tuples of tensors), decoded as plain JSON
Node = Union[LeafRecord, list, None]  # noqa: UP007 - msgspec reads the union from this alias
Container = Union[list[Node], dict[str, Node], None]  # noqa: UP007
#: a ``parameters_grad`` entry: ``{parameter name: [leaf]}`` (compare.md §2)
ParametersGrad = dict[str, Union[list[Node], LeafRecord, None]]  # noqa: UP007


class EntryRecord(msgspec.Struct, gc=False):
    """One entry (an API or module call); other keys are ignored, as the classic walker ignores them."""

    input_args: Container = None
    input_kwargs: Container = None
    input: Container = None
    parameters: Container = None
    output: Container = None


class DumpRecord(msgspec.Struct, gc=False):
    task: Any = None
    level: Any = None
    framework: Any = None
    dump_data_dir: Any = None
    data: dict[str, EntryRecord] | None = None


class RawEntriesRecord(msgspec.Struct, gc=False):
    """The header with each entry left undecoded: a ``parameters_grad`` entry is a container of its own."""

    task: Any = None
    level: Any = None
    framework: Any = None
    dump_data_dir: Any = None
    data: dict[str, msgspec.Raw] | None = None


_DUMP = msgspec.json.Decoder(DumpRecord)
_RAW_ENTRIES = msgspec.json.Decoder(RawEntriesRecord)
_ENTRY = msgspec.json.Decoder(EntryRecord)
_PARAMETERS_GRAD = msgspec.json.Decoder(ParametersGrad)

_NON_JSON_TOKEN = re.compile(rb"-?Infinity|NaN")
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7]")  # ``\u0041``..``\u007f``: a letter written as an escape
_TOKEN_VALUES = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_RESTORED_FIELDS = ("Max", "Min", "Mean", "Norm", "value")
_FIELDS = LeafRecord.__struct_fields__
_INDEX_SUFFIXES = tuple(f".{i}" for i in range(64))  # a row name's list index, formatted once
_REQUIRES_GRAD_TEXT: dict[Any, str | None] = {True: "True", False: "False", None: None, UNSET: None}


class _Untyped(Exception):
    """The document holds something the fast path does not describe: read it the classic way."""


class TypedWalker(LeafWalker):
    """``LeafWalker`` over typed records; a leaf outside the hot case goes through the classic methods."""

    def __init__(self, path: Path, tokens: int) -> None:
        super().__init__(path)
        self.tokens_left = tokens  # quoted NaN/Infinity tokens not yet turned back into floats

    def add_entries(self, entries: Iterable[tuple[str, EntryRecord | ParametersGrad]]) -> None:
        """Every entry's rows, visited as ``LeafWalker`` visits them; entries in file order.

        The hot path, one pass per leaf: a tensor leaf with four float statistics becomes its row right here,
        with the rules of ``LeafWalker.leaf``; ``LeafWalker`` takes every other leaf. All of it is one loop,
        because the containers are small (one to three leaves) and a call per container costs more than its
        leaves do.
        """
        cols = self.cols
        entry_names, entry_starts = cols.entry_names, cols.entry_starts
        stats, plain, names = cols.stats, cols.plain, cols.names
        add_name, add_state, add_dtype = names.append, cols.states.append, cols.dtypes.append
        add_shape, add_rg, add_md5 = cols.shapes.append, cols.requires_grads.append, cols.md5s.append
        add_data_name, add_tensor = cols.data_names.append, cols.is_tensor.append
        shape_text, same_text, rg_text = self.shape_text, self.same_text, _REQUIRES_GRAD_TEXT
        leaf_record, float_, unset = LeafRecord, float, UNSET  # locals: this loop runs once per row
        for name, entry in entries:
            self.entry = name
            entry_names.append(name)
            entry_starts.append(len(names))
            if type(entry) is EntryRecord:  # the order of compare.md §2, as CONTAINERS lists it
                groups: Iterable[tuple[Any, str, str, int]] = (
                    (entry.input_args, ".input", STATE_INPUT, 0),
                    (entry.input_kwargs, ".input", STATE_INPUT, 0),
                    (entry.input, ".input", STATE_INPUT, 0),
                    (entry.parameters, ".parameters", STATE_PARAMETERS, 0),
                    (entry.output, ".output", STATE_OUTPUT, 0),
                )
            else:
                groups = _parameters_grad_groups(entry)  # type: ignore[arg-type]
            for node, suffix, state, depth in groups:
                if not node:  # absent, null, ``[]`` or ``{}``: no row
                    continue
                path = name + suffix
                # Each row's name suffix: ``.key``, ``.index`` (formatted once for short lists: ~5% of a
                # read), or none for a parameter's gradient, as LeafWalker.walk names them.
                items: Iterable[tuple[str, Any]]
                if type(node) is dict:
                    items = zip(map(_dot, node), node.values(), strict=True)
                elif state == STATE_PARAMETERS_GRAD:
                    items = zip(repeat(""), node)  # noqa: B905 - repeat() is endless
                elif len(node) <= len(_INDEX_SUFFIXES):
                    items = zip(_INDEX_SUFFIXES, node)  # noqa: B905 - the suffixes outnumber the items
                else:
                    items = zip(map(_dot, range(len(node))), node, strict=True)
                for key_suffix, rec in items:
                    sub = path + key_suffix
                    if rec.__class__ is not leaf_record:
                        if rec is None:
                            cols.add(sub, state, None, None, None, NONE4, None, None, False)
                        else:  # a nested list, decoded as plain JSON
                            self.walk(rec, sub, state, depth + 1)
                        continue
                    dtype, shape = rec.dtype, rec.shape
                    mx, mn, mean, norm = rec.Max, rec.Min, rec.Mean, rec.Norm
                    if not (dtype.__class__ is str and shape.__class__ is tuple and mx.__class__ is float_
                            and mn.__class__ is float_ and mean.__class__ is float_
                            and norm.__class__ is float_):  # fmt: skip
                        self.leaf(self.as_dict(rec), sub, state)
                        continue
                    md5, data_name = rec.md5, rec.data_name
                    if md5 is unset:
                        md5 = None
                    elif md5 is not None:
                        self.has_md5 = True
                    if data_name is unset:
                        data_name = None
                    try:
                        text = shape_text.get(shape)
                        if text is None:
                            text = shape_text[shape] = str(list(shape))
                    except TypeError:  # a nested list in a shape: unhashable, and rare
                        text = str(list(shape))
                    stats += (mx, mn, mean, norm)
                    plain.append(1)
                    add_name(sub)
                    add_state(state)
                    add_dtype(same_text.setdefault(dtype, dtype))
                    add_shape(text)
                    add_rg(rg_text[rec.requires_grad])
                    add_md5(md5)
                    add_data_name(data_name)
                    add_tensor(1)

    def as_dict(self, rec: LeafRecord) -> dict[str, Any]:
        """The leaf as the JSON parser would have given it (``leaf`` turns its quoted tokens back)."""
        out = {name: value for name in _FIELDS if (value := getattr(rec, name)) is not UNSET}
        if "shape" in out:
            out["shape"] = list(out["shape"])
        return out

    def leaf(self, rec: dict[str, Any], path: str, state: str) -> None:
        """``LeafWalker.leaf``, once the quoted NaN/Infinity tokens of statistics and values are floats again.

        Every leaf outside the hot path comes here: a record turned into a dict, or a dict of a nested list.
        """
        if self.tokens_left:
            for name in _RESTORED_FIELDS:
                value = rec.get(name)
                if type(value) is str and value in _TOKEN_VALUES:
                    rec[name] = _TOKEN_VALUES[value]
                    self.tokens_left -= 1
        super().leaf(rec, path, state)


def walk_typed(path: Path, raw: bytes) -> tuple[DumpRecord | RawEntriesRecord, TypedWalker] | None:
    """The header and the walked entries of ``raw``, or None where the classic reader must read it."""
    tokens = 0
    try:
        if b"NaN" in raw or b"Infinity" in raw:
            if _ESCAPED_LETTER.search(raw):
                # ``"\u004eaN"`` decodes to the text NaN too: a restored token could then be a string.
                raise _Untyped("NaN/Infinity tokens in a file that escapes letters")
            raw, tokens = _NON_JSON_TOKEN.subn(rb'"\g<0>"', raw)
        walker = TypedWalker(path, tokens)
        header: DumpRecord | RawEntriesRecord
        if b"parameters_grad" not in raw:
            header = _DUMP.decode(raw)
            entries = header.data or {}
            if any(map(_is_parameters_grad, entries)):  # a name spelled with an escape
                raise _Untyped("a parameters_grad entry whose name the file escapes")
            walker.add_entries(entries.items())
        else:
            header = _RAW_ENTRIES.decode(raw)
            walker.add_entries(_decoded_entries(header))  # type: ignore[arg-type]
        if walker.tokens_left:
            raise _Untyped(f"{walker.tokens_left} NaN/Infinity token(s) outside statistics and values")
        if not isinstance(header.task, str):
            raise _Untyped("no task")
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, DumpError, _Untyped) as exc:
        logger.debug("%s: read without the typed fast path (%s)", path, exc)
        return None
    return header, walker


def _dot(key: object) -> str:
    return f".{key}"


def _is_parameters_grad(name: str) -> bool:
    """The classic walker's test: such an entry is one container of its own (compare.md §2)."""
    return "parameters_grad" in name and "parameters_grad" in name.split(".")


def _decoded_entries(header: RawEntriesRecord) -> Iterator[tuple[str, EntryRecord | ParametersGrad]]:
    """Each entry decoded on its own: a ``parameters_grad`` one as a container, any other as an entry."""
    for name, raw_entry in (header.data or {}).items():
        if _is_parameters_grad(name):
            yield name, _PARAMETERS_GRAD.decode(raw_entry)
        else:
            yield name, _ENTRY.decode(raw_entry)


def _parameters_grad_groups(params: ParametersGrad) -> list[tuple[Any, str, str, int]]:
    """A ``parameters_grad`` entry as containers, the way ``LeafWalker.walk`` visits it from depth 0: a list
    of leaves per parameter (at depth 1), or a leaf or null of its own (as a one-item dict)."""
    return [(node, f".{key}", STATE_PARAMETERS_GRAD, 1) if type(node) is list
            else ({key: node}, "", STATE_PARAMETERS_GRAD, 0) for key, node in params.items()]  # fmt: skip
