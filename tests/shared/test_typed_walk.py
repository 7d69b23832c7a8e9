"""The typed fast path of the dump.json reader (``typed_walk``) against the classic one (``LeafWalker``).

What it proves: for every document, ``load_dump`` gives exactly the same ``Dump`` (every column, float bits
included, and the header) or exactly the same ``DumpError`` message whichever path reads it; the fast path is
taken for the ordinary documents msprobe writes (compact or ``indent=1``, bare NaN/Infinity tokens, md5 and
tensor dumps, ``parameters_grad`` entries, nested lists, every non-tensor encoding of dump-format.md §4.3) and
refused for what it does not describe (P2POp records, nested dicts, numbers out of range, lone surrogates,
byte-order marks, NaN/Infinity tokens it cannot restore); it parses floats exactly like ``json``.
"""

from __future__ import annotations

import json
import math
import random
import struct
import tempfile
from collections.abc import Callable, Iterator
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parity.shared.dump import reader
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.dump.typed_walk import walk_typed
from parity.shared.dump.writer import dumps_indent1
from parity.shared.errors import DumpError

from tests.factories import scalar_leaf, stats_leaf

# ----------------------------------------------------------------------------------------------------------
# helpers

#: the fields of ``DumpColumns.to_wire()``, in its order
WIRE_FIELDS = ("entry_names", "names", "apis", "entry_of", "states", "dtypes", "shapes", "requires_grads",
               "stats", "plain", "odd", "md5s", "data_names", "is_tensor", "p2p", "dims",
               "arg_types")  # fmt: skip

#: how a document is written: compact, as msprobe does (``indent=1``), and compact with raw UTF-8
LAYOUTS: dict[str, Callable[[Any], str]] = {
    "compact": json.dumps,
    "indent1": dumps_indent1,
    "utf8": lambda doc: json.dumps(doc, ensure_ascii=False),
}


def _canon(value: Any) -> Any:
    """``value`` with each scalar tagged with its type and each float replaced by its bits: two canons are
    equal exactly when the values are the same (NaN equals NaN; -0.0 is not 0.0; 1, 1.0 and True differ)."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(_canon, value))
    if isinstance(value, dict):
        return ("dict", *((_canon(k), _canon(v)) for k, v in value.items()))
    return (type(value).__name__, value)


def assert_same_dump(a: Dump, b: Dump) -> None:
    """``a`` and ``b`` are the same dump: header, path, md5 flag and every column (stats as bytes)."""
    assert (a.path, a.task, a.level, a.framework, a.dump_data_dir, a.has_md5) == (
        b.path, b.task, b.level, b.framework, b.dump_data_dir, b.has_md5
    )  # fmt: skip
    for field_name, x, y in zip(WIRE_FIELDS, a.columns.to_wire(), b.columns.to_wire(), strict=True):
        if field_name in ("stats", "entry_of"):  # bytes of doubles / ints: compare them value by value
            x, y = _unpack(x, field_name), _unpack(y, field_name)
        if _canon(x) != _canon(y):
            pytest.fail(f"column {field_name!r} differs: {_first_difference(x, y)}")
    assert a.columns.stats.tobytes() == b.columns.stats.tobytes()


def _unpack(blob: bytes, field_name: str) -> tuple[Any, ...]:
    code = "d" if field_name == "stats" else "i"
    return struct.unpack(f"<{len(blob) // struct.calcsize(code)}{code}", blob)


def _first_difference(x: Any, y: Any) -> str:
    """Where two columns first differ, shortly (a column can hold thousands of rows)."""
    if isinstance(x, dict) and isinstance(y, dict):
        x, y = list(x.items()), list(y.items())
    if isinstance(x, (list, tuple, bytes)) and isinstance(y, (list, tuple, bytes)):
        for i, (u, v) in enumerate(zip(x, y, strict=False)):
            if _canon(u) != _canon(v):
                return f"at {i}: {u!r} != {v!r}"
        return f"lengths {len(x)} != {len(y)}"
    return f"{x!r} != {y!r}"


def _load_classic(path: Path) -> Dump:
    """``load_dump`` with the fast path forced off."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reader, "walk_typed", None)
        return load_dump(path)


def _outcome(load: Callable[[Path], Dump], path: Path) -> Dump | str:
    """The dump ``load`` reads, or the message of the ``DumpError`` it raises."""
    try:
        return load(path)
    except DumpError as exc:
        return f"DumpError: {exc}"


def _assert_same_outcome(path: Path) -> None:
    """Both paths read the same dump, or both raise a ``DumpError`` with the same message."""
    fast, classic = _outcome(load_dump, path), _outcome(_load_classic, path)
    if isinstance(fast, Dump) and isinstance(classic, Dump):
        assert_same_dump(fast, classic)
    else:
        assert isinstance(fast, str) and isinstance(classic, str), (_summary(fast), _summary(classic))
        assert fast == classic


def _summary(outcome: Dump | str) -> str:
    return outcome if isinstance(outcome, str) else f"a dump of {len(outcome.columns)} rows"


def _fast_accepts(path: Path) -> bool:
    return walk_typed(path, path.read_bytes()) is not None


def _write(directory: Path, text: str | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "dump.json"
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return path


def _doc(data: Any, **header: Any) -> dict[str, Any]:
    """A dump.json document; ``header`` overrides (or, given ``...``, drops) a top-level field."""
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    doc.update(header)
    return {k: v for k, v in doc.items() if v is not ...}


def _leaf(x: float = 1.0, **extra: Any) -> dict[str, Any]:
    """A float tensor record with statistics derived from ``x``, plus ``extra`` fields."""
    return stats_leaf(x, -x, x / 4, 2 * x) | extra


def _raw_leaf(max_text: str, extra: str = "") -> str:
    """A tensor record as JSON text, Max written as ``max_text``, ``extra`` fields at its end: for documents
    ``json.dumps`` cannot write (duplicate keys, escapes, bare tokens in odd places)."""
    return ('{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": ' + max_text
            + ', "Min": 0.0, "Mean": 0.5, "Norm": 1.0' + extra + "}")  # fmt: skip


def _raw_doc(entries: str, header: str = "") -> str:
    """A dump.json text holding the entries ``entries`` (JSON text); ``header`` adds top-level fields."""
    return '{"task": "statistics", "level": "L1"' + header + ', "data": {' + entries + "}}"


def _raw_output(max_text: str, extra: str = "") -> str:
    """A dump.json text whose one entry outputs one ``_raw_leaf``."""
    return _raw_doc(f'"A.0.forward": {{"output": [{_raw_leaf(max_text, extra)}]}}')


# ----------------------------------------------------------------------------------------------------------
# 1. ordinary documents: the fast path reads them, and reads them as the classic path does

NAN, INF = math.nan, math.inf

SCALAR_LEAVES: list[Any] = [
    scalar_leaf(3), scalar_leaf(-(2**63)), scalar_leaf(2**64 - 1), scalar_leaf(0.5), scalar_leaf(True),
    scalar_leaf(False), scalar_leaf("=cmd"), scalar_leaf(""), {"type": "NoneType", "value": None},
    {"type": "int"},
    {"type": "torch.Size", "value": [2, 3]}, {"type": "torch.Size", "value": []},
    {"type": "slice", "value": [0, None, 2]}, {"type": "slice", "value": None},
    {"type": "ellipsis", "value": "..."},
    {"type": "torch.ProcessGroup", "group_ranks": [0, 1], "group_id": "12"},
    {"type": "torch.ProcessGroup"},
    {"type": "torch.memory_format", "format": "channels_last"},
    {"type": "torch.memory_format", "value": None},
    {"type": "torch.memory_format", "format": None, "value": "x"},
    {"type": "torch.dtype", "value": "torch.float16"}, {"type": "torch.device", "value": "cuda:0"},
    {"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"}, {"type": "float32", "value": 1.5},
    {"type": "list", "value": [1, 2.5, None]}, {"type": "dict", "value": {"a": [1], "b": "c"}},
    {"type": "int", "value": 7, "md5": "0000abcd", "requires_grad": False, "data_name": "x.pt"},
]  # fmt: skip

#: the rank arguments of torch.distributed calls, which keep their type name as their dtype
RANK_ARGS = {key: scalar_leaf(i) for i, key in enumerate(("src", "dst", "group_src", "group_dst"))}

FAST_DOCS: dict[str, dict[str, Any]] = {
    "plain": _doc({
        "Functional.linear.0.forward": {
            "input_args": [_leaf(1.5, requires_grad=True), _leaf(2.0)],
            "output": [stats_leaf(0.25, -0.125, 1e-3, 7.0, requires_grad=None, shape=(2, 8))],
        },
        "Tensor.add.1.forward": {"input_args": [_leaf(-3.0), _leaf(5e-324)], "output": [_leaf(1e300)]},
    }),
    "nan_and_infinity": _doc({
        "Torch.div.0.forward": {
            "input_args": [stats_leaf(NAN, -INF, INF, NAN), stats_leaf(INF, INF, NAN, -0.0)],
            "input_kwargs": {"alpha": scalar_leaf(NAN), "beta": scalar_leaf(INF), "gamma": scalar_leaf(-INF)},
            "output": [stats_leaf(NAN, NAN, NAN, NAN), stats_leaf(-INF, -INF, -INF, INF, dtype="torch.bf16")],
        },
    }),
    "nan_in_odd_stats": _doc({
        "Torch.f.0.forward": {"output": [stats_leaf(NAN, 1, None, True), stats_leaf(INF, None, None, None)]},
    }),
    "md5": _doc({
        "Torch.f.0.forward": {"input_args": [_leaf(md5="0a0b0c0d"), _leaf(2.0, md5="ffffffff")],
                              "output": [_leaf(3.0, md5="")]},  # fmt: skip
        "Torch.g.0.forward": {"output": [_leaf(md5=None)]},
    }),
    "tensor_task": _doc({
        "Functional.conv2d.0.forward": {
            "input_args": [_leaf(data_name="Functional.conv2d.0.forward.input.0.pt"), _leaf(data_name=None)],
            "output": [_leaf(4.0, data_name="Functional.conv2d.0.forward.output.0.pt")],
        },
    }, task="tensor", dump_data_dir="/data/step0/rank0/dump_tensor_data"),
    "parameters_grad": _doc({
        "Module.layer.Linear.forward.0": {"input_args": [_leaf()], "output": [_leaf(2.0)]},
        "Module.layer.Linear.parameters_grad": {
            "weight": [_leaf(0.5, requires_grad=True)], "bias": [_leaf(NAN)], "single": _leaf(3.0),
            "none": None, "empty": [], "pair": [None, [_leaf(), _leaf(INF)]],
        },
        "Module.parameters_grad_norm.Norm.forward.0": {"output": [_leaf()]},
        "Module.x.parameters_grad.0": {"w": [_leaf(), _leaf(md5="00000001")]},
        "Module.layer.Linear.backward.0": {"input": [_leaf(-1.0)], "output": [None]},
    }),
    "text_parameters_grad_only_inside_a_name": _doc({
        "Module.parameters_grad_clip.Clip.forward.0": {"input_args": [_leaf()], "weight": [_leaf()]},
    }),
    "nested_lists": _doc({
        "Torch.cat.0.forward": {
            "input_args": [[_leaf(1.0), _leaf(2.0)], scalar_leaf(0)],
            "input_kwargs": {"tensors": [_leaf(), [_leaf(3.0), None, [scalar_leaf("x")]]], "out": None},
            "output": [_leaf(4.0)],
        },
        "Torch.stack.0.forward": {"input_args": [[[[_leaf()]]], [], [[]]]},
    }),
    "kwargs_and_backward": _doc({
        "Functional.dropout.0.forward": {
            "input_args": [_leaf()], "input_kwargs": {"p": scalar_leaf(0.1), "training": scalar_leaf(True),
                                                      "inplace": scalar_leaf(False), **RANK_ARGS},
            "output": [_leaf()],
        },
        "Functional.dropout.0.backward": {"input": [_leaf(2.0)], "output": [_leaf(3.0), None]},
        "Tensor.mul.0.backward": {"input": {"grad": _leaf()}, "output": {}},
    }),
    "parameters": _doc({
        "Module.fc.Linear.forward.0": {"input_args": [_leaf()], "output": [_leaf(2.0)],
                                       "parameters": {"weight": _leaf(0.5), "bias": None}},  # fmt: skip
        "Module.bn.BatchNorm.forward.0": {"parameters": [_leaf(), _leaf(NAN)]},
    }),
    "null_and_empty": _doc({
        "Torch.a.0.forward": {"input_args": [None, None], "input_kwargs": {}, "output": []},
        "Torch.b.0.forward": {},
        "Torch.c.0.forward": {"input_args": None, "input_kwargs": None, "input": None, "parameters": None,
                              "output": None},  # fmt: skip
        "Torch.d.0.forward": {"input_args": [[], [[]]], "output": [None]},
        "Torch.e.0.forward": {"input_kwargs": {"a": None, "b": []}},
    }),
    "scalar_leaves": _doc({
        "Torch.f.0.forward": {"input_args": SCALAR_LEAVES,
                              "input_kwargs": RANK_ARGS | {"dim": scalar_leaf(-1)}},
        "Torch.g.0.forward": {"input_kwargs": {f"k{i}": leaf for i, leaf in enumerate(SCALAR_LEAVES)}},
        "Distributed.send.0.forward": {"input_args": [_leaf(), {"type": "int", "value": 1}],
                                       "input_kwargs": {"dst": {"type": "int", "value": 3}}},  # fmt: skip
    }),
    "int_bool_and_missing_stats": _doc({
        "Torch.f.0.forward": {
            "input_args": [
                stats_leaf(3, 0, 1.5, 2**63, dtype="torch.int64"), stats_leaf(2**64 - 1, -(2**63), 0, 0),
                stats_leaf(True, False, None, None, dtype="torch.bool"),
                {"type": "torch.Tensor", "dtype": "torch.bool", "shape": [3], "Max": True, "Min": False},
                {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]},
                stats_leaf(None, None, None, None, shape=(0,), requires_grad=None),
                stats_leaf(1.0, 0.0, 0.5, "1.0"), stats_leaf(1.0, 0.0, 0.5, -0.0),
            ],
        },
    }),
    "shapes": _doc({
        "Torch.f.0.forward": {
            "input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0, shape=s) for s in
                           ([], [0], [2**63, 3], [1, 0, 5], [2**64 - 1, 2**62], [-1], [2, 4], [4, 2])],
            "output": [stats_leaf(1.0, 0.0, 0.5, 1.0, shape=[2, 4])],
        },
    }),
    "unknown_extra_keys": _doc({
        "Torch.f.0.forward": {
            "input_args": [_leaf(extra=1, note="x", nested={"a": [1, {"b": None}]}, Max_=2.0),
                           scalar_leaf(2) | {"extra": [1, 2]}, _leaf(tensor_stat_index=3)],
            "is_recompute": False, "stack": ["frame"], "grad": {"nested": [{"x": 1}]},
        },
    }, extra="header", version=[1, 2]),
    "non_ascii_and_escapes": _doc({
        "Torch.f.0.forward.名前": {
            "input_args": [_leaf(), scalar_leaf("héllo \U0001f600 \"q\" \\ / \n\t\x00\x7f")]},
        'Torch.g"q\\.0.forward\u2028': {"output": [_leaf(dtype="torch.float\u00e9")]},
        "Torch.\U0001f600.0.forward": {"output": [scalar_leaf("\u0000\u001f\ufffe")]},
    }),
    "big_ints_with_a_nan_token": _doc({"Torch.f.0.forward": {
        "input_args": [stats_leaf(2**70, -(2**64), 0, NAN, shape=[2**70, 3]), scalar_leaf(-(2**80))]}}),
    "nan_in_nested_list_leaf": _doc({"Torch.cat.0.forward": {"input_args": [[_leaf(NAN), [_leaf(INF)], None]],
                                                             "input_kwargs": {"t": [[scalar_leaf(NAN)]]}}}),
    "header_level_number_framework_empty_dir_list": _doc({"Torch.f.0.forward": {"output": [_leaf()]}},
                                                         level=3, framework="", dump_data_dir=["a"]),
    "header_framework_null": _doc({"Torch.f.0.forward": {"output": [_leaf()]}}, framework=None, level=None),
    "header_framework_mindspore": _doc({}, framework="mindspore", level="L0", dump_data_dir=7),
    "no_data": _doc(..., framework=...),
    "data_null": _doc(None),
    "only_task": {"task": "tensor"},
}  # fmt: skip

#: documents json.dumps cannot write: duplicate keys, non-ASCII text written as escapes
FAST_RAW: dict[str, str] = {
    "duplicate_key_in_entry": _raw_doc(
        f'"Torch.f.0.forward": {{"input_args": [{_raw_leaf("1.0")}], "output": [{_raw_leaf("2.0")}], '
        f'"input_args": [{_raw_leaf("3.0")}, null]}}'
    ),
    "duplicate_key_in_leaf": _raw_doc(
        '"Torch.f.0.forward": {"output": ['
        + _raw_leaf(
            "1.0",
            ', "Max": 2, "dtype": "torch.int8", "shape": [], "requires_grad": true, '
            '"requires_grad": false, "md5": null, "md5": "abc"',
        )
        + ', {"type": "int", "value": 1, "value": "two"}]}'
    ),
    "duplicate_entry_and_header": _raw_doc(
        f'"A.0.forward": {{"output": [{_raw_leaf("1.0")}]}}, "B.0.forward": {{}}, '
        f'"A.0.forward": {{"input_args": [{_raw_leaf("NaN")}]}}',
        ', "level": "L0", "framework": 1, "framework": "mindspore"',
    ),
    "escaped_names_and_values": _raw_doc(
        '"Torch.\\u0066\\u00e9\\ud83d\\ude00.0.forward": {"input_args": ['
        + _raw_leaf("-1.5")
        + ', {"type": "str", "value": "\\u0041\\"\\\\\\/\\b\\f\\n\\r\\t"}]}'
    ),
    "integer_of_4300_digits": _raw_output("9" * 4300),
    "whitespace": " \t\r\n"
    + _raw_doc(f'"A.0.forward" :\r\n{{ "output"\t: [ {_raw_leaf("NaN")} ] }}')
    + "\n\n",
}


def _fast_cases() -> Iterator[Any]:
    for name, doc in FAST_DOCS.items():
        for layout, dumps in LAYOUTS.items():
            yield pytest.param(dumps(doc), id=f"{name}-{layout}")
    for name, text in FAST_RAW.items():
        yield pytest.param(text, id=name)


@pytest.mark.parametrize("text", list(_fast_cases()))
def test_fast_path_taken_and_same_dump(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, text)
    assert _fast_accepts(path)
    assert_same_dump(load_dump(path), _load_classic(path))


def test_canon_tells_apart_what_differs() -> None:
    """A guard on the comparison itself: types, signed zeros and NaNs are told apart as they should be."""
    assert _canon([1, 1.0, True]) != _canon([1.0, 1, 1])
    assert _canon((0.0, NAN)) == _canon((0.0, float("nan"))) != _canon((-0.0, NAN))
    assert _canon({"a": None}) != _canon({"a": "None"})


# ----------------------------------------------------------------------------------------------------------
# 2. documents the fast path refuses: the classic path reads them, with the same result

FALLBACK_DOCS: dict[str, dict[str, Any]] = {
    "p2pop": _doc({
        "Distributed.batch_isend_irecv.0.forward": {"input_args": [[{
            "class_type": "torch.distributed.P2POp", "op": "isend", "peer": 1, "tag": 0, "tensor": _leaf(),
        }]]},
        "Distributed.isend.0.forward": {"input_args": [{
            "class_type": "torch.distributed.P2POp", "op": "irecv", "peer": 0, "tag": 3, "group_id": "5",
            "tensor": None}]},
    }),
    "nested_dict_in_list": _doc({"Torch.f.0.forward": {"input_args": [{"a": _leaf(), "b": [_leaf(2.0)]}]}}),
    "empty_dict_in_list": _doc({"Torch.f.0.forward": {"input_args": [{}, [], _leaf()], "output": [[{}]]}}),
    "nested_dict_in_kwargs": _doc({"Torch.f.0.forward": {"input_kwargs": {"opts": {"w": _leaf()}}}}),
    "leaf_as_a_container": _doc({"Torch.f.0.forward": {"output": _leaf()}}),
    "nan_text_in_entry_name": _doc({"Torch.nan_to_num.0.forward": {"output": [_leaf()]},
                                    "Torch.NaN.0.forward": {"output": [_leaf(NAN)]}}),  # fmt: skip
    "infinity_text_in_string_value": _doc({"Torch.f.0.forward": {
        "input_args": [scalar_leaf("Infinity"), scalar_leaf("-Infinity and NaN"), _leaf(INF)]}}),
    "nan_text_in_header": _doc({"Torch.f.0.forward": {"output": [_leaf(NAN)]}}, level="NaN"),
    "nan_in_shape": _doc({"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0, shape=(NAN, 2))]}}),
    "nan_in_unknown_leaf_field": _doc({"Torch.f.0.forward": {"output": [_leaf(extra=NAN)]}}),
    "nan_in_unknown_entry_field": _doc({"Torch.f.0.forward": {"output": [_leaf()], "x": [INF]}}),
    "nan_in_header_field": _doc({}, dump_data_dir=NAN),
    "nan_in_group_ranks": _doc({"Torch.f.0.forward": {"input_args": [
        {"type": "torch.ProcessGroup", "group_ranks": [NAN]}]}}),
    "nan_in_scalar_list_value": _doc({"Torch.f.0.forward": {"input_args": [
        {"type": "list", "value": [NAN]}]}}),
    "lone_surrogate_in_name": _doc({"Torch.\ud800.0.forward": {"output": [_leaf()]}}),
    "lone_surrogate_in_data_name": _doc({"Torch.f.0.forward": {"input_args": [_leaf(data_name="\udfff")]}}),
    "null_leaf_type": _doc({"Torch.f.0.forward": {"input_args": [{"type": None, "x": None}]}}),
    "empty_dict_in_parameters_grad": _doc({"Module.l.parameters_grad": {"w": {}, "b": [_leaf()]}}),
}  # fmt: skip

FALLBACK_RAW: dict[str, str | bytes] = {
    "number_out_of_range": _raw_output("1e400"),
    "negative_number_out_of_range": _raw_output("-1e400"),
    "number_just_out_of_range": _raw_output("1.7976931348623159e308"),
    "byte_order_mark": b"\xef\xbb\xbf" + _raw_output("NaN").encode(),
    "utf8_encoded_surrogate": _raw_doc('"A\xed\xa0\x80.0.forward": {}').encode("latin-1"),
    "nan_as_an_entry_name": _raw_doc(f'"A.0.forward": {{"output": [{_raw_leaf("NaN")}]}}, "NaN": {{}}'),
}  # fmt: skip


def _fallback_cases() -> Iterator[Any]:
    for name, doc in FALLBACK_DOCS.items():
        for layout in ("compact", "indent1"):
            yield pytest.param(LAYOUTS[layout](doc), id=f"{name}-{layout}")
    for name, text in FALLBACK_RAW.items():
        yield pytest.param(text, id=name)


@pytest.mark.parametrize("text", list(_fallback_cases()))
def test_fast_path_refuses_and_classic_reads_the_same(tmp_path: Path, text: str | bytes) -> None:
    path = _write(tmp_path, text)
    assert not _fast_accepts(path)
    assert_same_dump(load_dump(path), _load_classic(path))


# ----------------------------------------------------------------------------------------------------------
# 3. bad documents: the same DumpError either way

_ENTRY = "Torch.f.0.forward"


def _bad_leaf(**fields: Any) -> str:
    """A dump whose second input is a tensor record with ``fields`` changed (the first holds NaNs)."""
    rec = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
           "Mean": 0.5, "Norm": 1.0} | fields  # fmt: skip
    return json.dumps(_doc({_ENTRY: {"input_args": [_leaf(NAN), rec]}}))


def _nested(levels: int, leaf: dict[str, Any]) -> str:
    """``leaf`` inside ``levels`` lists, as JSON text."""
    return "[" * levels + json.dumps(leaf) + "]" * levels


def _deep(levels: int, leaf: dict[str, Any] | None = None) -> str:
    """A dump whose one input is ``leaf`` (a tensor with a NaN) nested ``levels`` lists deep."""
    return _raw_doc(f'"{_ENTRY}": {{"input_args": {_nested(levels, leaf or _leaf(NAN))}}}')


BAD_DOCS: dict[str, str | bytes] = {
    "malformed_json": '{"task": "statistics",\n "data": {,}}',
    "malformed_json_after_nan": _raw_output("NaN") + "\n}",
    "trailing_comma": _raw_output("Infinity").replace("}]", "},]"),
    "control_character_in_string": _raw_doc('"A\t.0.forward": {}'),
    "invalid_escape": _raw_doc('"A\\x.0.forward": {}'),
    "invalid_escape_before_a_nan_token": '{"task": "statistics", "x": "\\NaN, "data": {}}',
    "negative_nan": _raw_output("-NaN"),
    "empty_file": "",
    "not_utf8": b'{"task": "statistics", "data": {"A\xff.0.forward": {}}}',
    "not_utf8_with_nan": _raw_output("NaN").replace("A.0", "A\xff.0").encode("latin-1"),
    "top_level_list": "[1, 2]",
    "top_level_null": "null",
    "task_missing": json.dumps({"data": {}}),
    "task_a_number": json.dumps(_doc({}, task=3)),
    "task_null_with_nan": json.dumps(_doc({_ENTRY: {"output": [_leaf(NAN)]}}, task=None)),
    "data_a_list": json.dumps(_doc([1])),
    "data_a_string": json.dumps(_doc("x")),
    "entry_not_an_object": json.dumps(_doc({_ENTRY: [1]})),
    "entry_null": json.dumps(_doc({_ENTRY: None})),
    "parameters_grad_entry_a_list": json.dumps(_doc({"Module.l.parameters_grad": [_leaf()]})),
    "container_a_number": json.dumps(_doc({_ENTRY: {"input_args": 3}})),
    "container_a_string_in_parameters_grad_dump": json.dumps(
        _doc({_ENTRY: {"output": "x"}, "Module.l.parameters_grad": {}})),
    "container_false": json.dumps(_doc({_ENTRY: {"input_kwargs": False}})),
    "number_in_a_container": json.dumps(_doc({_ENTRY: {"input_args": [_leaf(), 5]}})),
    "integer_leaf_type": json.dumps(_doc({_ENTRY: {"input_args": [{"type": 1, "value": None}]}})),
    "string_in_parameters_grad": json.dumps(_doc({"Module.l.parameters_grad": {"w": "x"}})),
    "dtype_not_a_string": _bad_leaf(dtype=5),
    "shape_not_a_list": _bad_leaf(shape="2x3"),
    "shape_null": _bad_leaf(shape=None),
    "requires_grad_yes": _bad_leaf(requires_grad="yes"),
    "requires_grad_one": _bad_leaf(requires_grad=1),
    "md5_a_number": _bad_leaf(md5=3),
    "data_name_a_list": _bad_leaf(data_name=[1]),
    "stat_a_list": _bad_leaf(Max=[1]),
    "stat_a_dict": _bad_leaf(Norm={"a": 1}),
    "tensor_stat_index_placeholder": _bad_leaf(Max=None, tensor_stat_index=3),
    "nan_as_object_key": _raw_output("NaN", ', "x": {NaN: 1}'),
    "infinity_as_object_key": '{Infinity: 1, "task": "statistics"}',
    "tensor_without_dtype": json.dumps(_doc({_ENTRY: {"output": [{"type": "torch.Tensor", "shape": [2]}]}})),
    "dtensor_without_dtype": _bad_leaf(type="torch.distributed.tensor.DTensor", dtype=None),
    "nested_402_levels": _deep(402),
    "nested_450_levels": _deep(450),
    "nested_450_levels_without_nan": _deep(450, _leaf()),
    "nested_450_levels_in_kwargs": _raw_doc(
        f'"{_ENTRY}": {{"input_kwargs": {{"a": {_nested(450, _leaf())}}}}}'),
    "nested_450_levels_in_parameters_grad": _raw_doc(
        f'"Module.l.parameters_grad": {{"w": {_nested(450, _leaf())}}}'),
    "shape_missing": json.dumps(_doc({_ENTRY: {"input_args": [
        {"type": "torch.Tensor", "dtype": "torch.float32", "Max": NAN, "Min": 0.0, "Mean": 0.5}]}})),
}  # fmt: skip


@pytest.mark.parametrize("text", [pytest.param(v, id=k) for k, v in BAD_DOCS.items()])
def test_bad_document_same_error(tmp_path: Path, text: str | bytes) -> None:
    path = _write(tmp_path, text)
    assert not _fast_accepts(path)
    with pytest.raises(DumpError) as fast:
        load_dump(path)
    with pytest.raises(DumpError) as classic:
        _load_classic(path)
    assert str(fast.value) == str(classic.value)


@pytest.mark.parametrize("levels", [399, 400, 401])
def test_nesting_up_to_the_limit_is_read_the_same(tmp_path: Path, levels: int) -> None:
    path = _write(tmp_path, _deep(levels, _leaf()))
    assert _fast_accepts(path)
    assert_same_dump(load_dump(path), _load_classic(path))


# ----------------------------------------------------------------------------------------------------------
# discrepancies this file found, fixed since: each test names the case


@pytest.mark.parametrize(
    "leaf", [_raw_leaf('"\\u004eaN"'), '{"type": "str", "value": "\\u0049nfinity"}'], ids=["max", "value"]
)
def test_escaped_nan_string_is_not_a_token(tmp_path: Path, leaf: str) -> None:
    other = _raw_leaf("1.0", ', "extra": NaN')
    path = _write(tmp_path, _raw_doc(f'"A.0.forward": {{"input_args": [{leaf}, {other}]}}'))
    _assert_same_outcome(path)


def test_escaped_nan_string_does_not_hide_a_bad_token(tmp_path: Path) -> None:
    leaves = _raw_leaf('"\\u004eaN"') + ", " + _raw_leaf("1.0", ', "x": {NaN: 1}')
    path = _write(tmp_path, _raw_doc(f'"A.0.forward": {{"input_args": [{leaves}]}}'))
    _assert_same_outcome(path)


def test_escaped_parameters_grad_name(tmp_path: Path) -> None:
    path = _write(tmp_path, _raw_doc(f'"Module.l.parameters\\u005fgrad": {{"weight": [{_raw_leaf("1.0")}]}}'))
    _assert_same_outcome(path)


@pytest.mark.parametrize(
    "leaf",
    [
        stats_leaf(2**64, 0, 0.5, 1.0),
        stats_leaf(1.0, -(2**63) - 1, 0.5, 1.0),
        stats_leaf(1.0, 0.0, 0.5, 1.0, shape=[2**70]),
        scalar_leaf(2**70),
    ],
    ids=["max", "min", "shape", "value"],
)
def test_integers_beyond_64_bits(tmp_path: Path, leaf: dict[str, Any]) -> None:
    path = _write(tmp_path, json.dumps(_doc({_ENTRY: {"input_args": [leaf]}})))
    assert _fast_accepts(path)
    assert_same_dump(load_dump(path), _load_classic(path))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_deep(1100, _leaf()), id="nested_1100_levels-RecursionError"),
        pytest.param(_raw_output("9" * 4301), id="integer_of_4301_digits-ValueError"),
    ],
)
def test_bad_document_raises_a_dump_error(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, text)
    for load in (load_dump, _load_classic):
        with pytest.raises(DumpError):
            load(path)


def test_a_lone_surrogate_in_a_str_value_is_read_and_hashed(tmp_path: Path) -> None:
    # Valid JSON; it used to escape as UnicodeEncodeError from the row's checksum.
    path = _write(tmp_path, json.dumps(_doc({_ENTRY: {"input_args": [scalar_leaf("\udfff")]}})))
    _assert_same_outcome(path)
    dump = load_dump(path)
    assert dump.columns.odd[0][0] == "\udfff" and dump.columns.md5s[0] is not None


# ----------------------------------------------------------------------------------------------------------
# 4. random documents

_FLOATS = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
_INTS = st.integers(-(2**63), 2**64 - 1)  # wider ones: see test_integers_beyond_64_bits
_STAT = st.one_of(_FLOATS, _FLOATS, st.sampled_from([-0.0, 0.0, 5e-324, -2.2250738585072014e-308]),
                  _INTS, st.booleans(), st.none())  # fmt: skip
_NAME = st.text(st.sampled_from('abN.aI_0 é"\\\n'), max_size=6)
_VALUE = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _NAME,
                   st.lists(st.one_of(st.integers(-3, 3), st.none()), max_size=3))  # fmt: skip


def _optional(**fields: st.SearchStrategy[Any]) -> dict[str, st.SearchStrategy[Any]]:
    """The optional keys of a ``fixed_dictionaries`` record, written as keyword arguments."""
    return fields


_TENSOR = st.fixed_dictionaries(
    {"type": st.sampled_from(["torch.Tensor", "numpy.ndarray", "torch.nn.parameter.Parameter"]),
     "dtype": st.sampled_from(["torch.float32", "torch.int64", "float16", ""]),
     "shape": st.lists(st.one_of(st.integers(0, 9), _INTS), max_size=3),
     "Max": _STAT, "Min": _STAT},
    optional=_optional(Mean=_STAT, Norm=_STAT, requires_grad=st.one_of(st.booleans(), st.none()),
                       md5=st.one_of(st.none(), st.text("0123456789abcdef", min_size=8, max_size=8)),
                       data_name=st.one_of(st.none(), _NAME), extra=_VALUE),
)  # fmt: skip
_SCALAR = st.fixed_dictionaries(
    {"type": st.sampled_from(["int", "float", "bool", "str", "NoneType", "torch.Size", "slice", "ellipsis",
                              "torch.ProcessGroup", "torch.memory_format", "torch.dtype", "Tensor"])},
    optional=_optional(value=_VALUE, group_ranks=st.lists(st.integers(0, 7), max_size=3), format=_VALUE,
                       md5=st.one_of(st.none(), _NAME), requires_grad=st.booleans()),
)  # fmt: skip
_NODE = st.recursive(st.one_of(_TENSOR, _TENSOR, _SCALAR, st.none()),
                     lambda children: st.lists(children, max_size=3), max_leaves=8)  # fmt: skip
_CONTAINER = st.one_of(st.lists(_NODE, max_size=4), st.dictionaries(_NAME, _NODE, max_size=3), st.none())
_ENTRY_RECORD = st.fixed_dictionaries(
    {}, optional=_optional(input_args=_CONTAINER, input_kwargs=_CONTAINER, input=_CONTAINER,
                           parameters=_CONTAINER, output=_CONTAINER, extra=_VALUE),
)  # fmt: skip
_GRAD_RECORD = st.dictionaries(_NAME, st.one_of(st.lists(_NODE, max_size=3), _TENSOR, st.none()), max_size=3)
_ENTRIES = st.lists(
    st.one_of(st.tuples(st.from_regex(r"Torch\.[a-z]{1,3}\.[0-2]\.(forward|backward)", fullmatch=True),
                        _ENTRY_RECORD),
              st.tuples(st.from_regex(r"Module\.[a-z]{1,2}\.parameters_grad(\.0)?", fullmatch=True),
                        _GRAD_RECORD)),
    max_size=5,
)  # fmt: skip
_DOCS = st.builds(
    lambda entries, task, level, framework: {"task": task, "level": level, "framework": framework,
                                             "data": dict(entries)},
    _ENTRIES, st.one_of(st.sampled_from(["statistics", "tensor"]), st.just(None)),
    st.one_of(st.sampled_from(["L0", "L1", "mix"]), st.integers(0, 3), st.none()),
    st.sampled_from(["pytorch", "", None]),
)  # fmt: skip


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("typed_walk")


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_DOCS, layout=st.sampled_from(["compact", "indent1"]))
def test_random_documents_read_the_same(scratch: Path, doc: dict[str, Any], layout: str) -> None:
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        _assert_same_outcome(_write(Path(directory), LAYOUTS[layout](doc)))


# ----------------------------------------------------------------------------------------------------------
# 5. floats: every text parses to the very double json gives


def _float_shaped(text: str) -> str:
    """``text`` with a fraction where it is an integer (beyond 64 bits orjson reads one as a float: see
    ``test_integers_beyond_64_bits``)."""
    return text + ".0" if text.lstrip("-").isdigit() else text


def _float_texts(rng: random.Random) -> list[str]:
    """Number texts that are hard to round: edge cases, random doubles in three notations, long digit
    strings, and exact midpoints between neighbouring doubles; padded to a multiple of four."""
    texts = [
        "9007199254740993",
        "9007199254740993.0",
        "9007199254740995e0",
        "2.2250738585072011e-308",
        "2.2250738585072012e-308",
        "2.4703282292062327e-324",
        "2.4703282292062328e-324",
        "4.9406564584124654e-324",
        "1.7976931348623157e308",
        "1.7976931348623158e308",
        "-0.0",
        "0e0",
        "1E5",
        "-0E-0",
        "1e-400",
        "0.1",
        "123456789012345678901234567890e-30",
        "1" + "0" * 400 + "e-400",
    ]
    for _ in range(600):
        value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(value):
            texts += [repr(value), f"{value:.17e}", _float_shaped(f"{value:.25g}")]
    for _ in range(600):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 120)))
        sign = rng.choice(["", "-"])
        texts.append(f"{sign}{rng.randint(1, 9)}.{digits}e{rng.randint(-330, 300)}")
        texts.append(f"{sign}{rng.randint(1, 9)}{digits[:20]}E+{rng.randint(0, 280)}")
    with localcontext() as ctx:
        ctx.prec = 1200
        for _ in range(200):  # exact midpoints between neighbouring doubles, and a hair either side
            bits = rng.getrandbits(62) + (1 << 52)
            low, high = (struct.unpack("<d", struct.pack("<Q", b))[0] for b in (bits, bits + 1))
            mid = (Decimal(low) + Decimal(high)) / 2
            hair = Decimal(10) ** (mid.adjusted() - 700)
            texts += [format(mid, "e"), format(mid + hair, "e"), format(mid - hair, "e")]
    return texts + ["0.0"] * (-len(texts) % 4)


def test_floats_parse_exactly(tmp_path: Path) -> None:
    texts = _float_texts(random.Random(20240611))
    assert len(texts) >= 3000
    leaves = ", ".join(
        '{{"type": "torch.Tensor", "dtype": "torch.float64", "shape": [1], "Max": {}, "Min": {}, "Mean": {}, '
        '"Norm": {}}}'.format(*texts[i : i + 4]) for i in range(0, len(texts), 4)
    )  # fmt: skip
    path = _write(tmp_path, _raw_doc(f'"Torch.f.0.forward": {{"input_args": [{leaves}]}}'))
    assert _fast_accepts(path)
    fast, classic = load_dump(path), _load_classic(path)
    assert_same_dump(fast, classic)
    assert fast.columns.stats.tobytes() == classic.columns.stats.tobytes()
    expected = [json.loads(t) for t in texts]
    got = [v for i in range(len(fast.columns)) for v in fast.columns.stats_of(i)]
    assert _canon(got) == _canon(expected)
