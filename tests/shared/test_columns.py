"""``DumpColumns``' wire form: ``from_wire(marshal.loads(marshal.dumps(to_wire())))`` gives the same columns.

The wire form is what a sidecar holds (``dump.sidecar``: the columns parsed at complete), so it must keep
every column as it was: odd statistics with their types (int, big int, bool, None, str), NaN and infinities
bit for bit, p2p dicts, entries without leaves, and the array and bytearray types the rest of the code reads.
"""

from __future__ import annotations

import json
import marshal
import math
import struct
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parity.shared.dump.columns import ColumnsBuilder, DumpColumns
from parity.shared.dump.reader import load_dump

from tests.factories import scalar_leaf, stats_leaf

FIELDS = ("entry_names", "names", "apis", "entry_of", "states", "dtypes", "shapes", "requires_grads", "stats",
          "plain", "odd", "md5s", "data_names", "is_tensor", "p2p", "dims", "arg_types")  # fmt: skip


def _round_trip(cols: DumpColumns) -> DumpColumns:
    return DumpColumns.from_wire(marshal.loads(marshal.dumps(cols.to_wire())))


def _typed(value: Any) -> Any:
    """A value with every float as its bits and every scalar tagged with its type.

    So NaN equals NaN and 1 differs from True.
    """
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return ("dict", [(_typed(k), _typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, array):
        return ("array", value.typecode, value.tobytes())
    if isinstance(value, bytearray):
        return ("bytearray", bytes(value))
    return (type(value).__name__, value)


def assert_same_columns(got: DumpColumns, want: DumpColumns) -> None:
    differ = [name for name in FIELDS if _typed(getattr(got, name)) != _typed(getattr(want, name))]
    assert differ == []
    assert len(got) == len(want)


def _odd_dump(tmp_path: Path) -> Path:
    p2p = {"class_type": "torch.distributed.P2POp", "op": "irecv", "peer": 3, "tag": 7, "group_id": None,
           "tensor": stats_leaf(1.0, 0.0, 0.5, 1.0)}  # fmt: skip
    data: dict[str, Any] = {
        "Torch.odd.0.forward": {
            "input_args": [
                stats_leaf(2**70, None, True, "x", dtype="torch.int64"),
                stats_leaf(math.nan, math.inf, -math.inf, -0.0),
                stats_leaf(3, -2, 0.5, 5e-324, dtype="torch.int32", requires_grad=None),
                stats_leaf(False, True, None, None, dtype="torch.bool", md5="0a0b0c0d"),
                stats_leaf(math.nan, 1, None, "nan", shape=(2, 0, 3)),
                scalar_leaf(7),
                scalar_leaf(2.5),
                scalar_leaf("mean"),
                scalar_leaf(True),
                None,
                {"type": "torch.Size", "value": [4, 5]},
                p2p,
            ],
            "input_kwargs": {"dim": scalar_leaf(-1), "out": None},
            "output": [stats_leaf(1.0, 0.0, 0.5, 1.0) | {"data_name": "Torch.odd.0.forward.output.0.pt"}],
        },
        "Torch.empty.0.forward": {"input_args": [], "output": []},
        "Module.fc.Linear.parameters_grad": {"weight": [stats_leaf(0.1, -0.1, 0.0, 0.3)]},
        "Distributed.send.0.forward": {"input_args": [p2p | {"tensor": None}]},
        "Torch.last.0.backward": {"input": [stats_leaf(1e308, -1e308, 1e-308, 1.7976931348623157e308)]},
    }
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "data": data}, allow_nan=True))
    return path


def test_a_read_dump_round_trips_through_marshal(tmp_path: Path) -> None:
    cols = load_dump(_odd_dump(tmp_path)).columns
    back = _round_trip(cols)
    assert_same_columns(back, cols)
    assert [repr(e) for e in back.entries()] == [repr(e) for e in cols.entries()]
    for i in range(len(cols)):
        a, b = back.leaf(i), cols.leaf(i)
        slots = ("name", "state", "dtype", "shape", "requires_grad", "max", "min", "mean", "norm", "md5",
                 "data_name", "is_tensor", "p2p")  # fmt: skip
        assert _typed([getattr(a, s) for s in slots]) == _typed([getattr(b, s) for s in slots]), i
    # What the dump holds, seen through the round-tripped columns.
    assert back.stats_of(0) == (2**70, None, True, "x")
    assert type(back.stats_of(0)[2]) is bool
    mx, mn, mean, norm = back.stats_of(1)
    assert math.isnan(mx) and (mn, mean) == (math.inf, -math.inf) and math.copysign(1.0, norm) == -1.0
    assert back.stats_of(3) == (False, True, None, None) and type(back.stats_of(3)[0]) is bool
    assert back.leaf(3).md5 == "0a0b0c0d"
    assert sorted(back.p2p.values(), key=repr) == sorted(cols.p2p.values(), key=repr)
    assert {"op": "irecv", "peer": 3, "tag": 7, "group_id": None} in back.p2p.values()
    assert "Torch.empty.0.forward" in back.entry_names and "Torch.empty.0.forward" not in back.apis


def test_round_tripped_columns_have_the_types_the_code_reads(tmp_path: Path) -> None:
    back = _round_trip(load_dump(_odd_dump(tmp_path)).columns)
    assert isinstance(back.entry_of, array) and back.entry_of.typecode == "i"
    assert isinstance(back.stats, array) and back.stats.typecode == "d"
    assert isinstance(back.plain, bytearray) and isinstance(back.is_tensor, bytearray)
    assert all(type(k) is int for k in (*back.odd, *back.p2p))
    assert len(back.stats) == 4 * len(back) == 4 * len(back.plain)


def test_the_wire_form_is_plain_values() -> None:
    cols = ColumnsBuilder().build()
    wire = cols.to_wire()
    marshal.dumps(wire)  # raises ValueError on anything marshal cannot carry (array, objects)
    assert all(type(part) in (list, bytes, dict) for part in wire)


def test_empty_columns_round_trip() -> None:
    cols = DumpColumns()
    back = _round_trip(cols)
    assert_same_columns(back, cols)
    assert len(back) == 0 and back.entries() == []


_stat = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
)
_row = st.tuples(
    st.tuples(_stat, _stat, _stat, _stat),
    st.sampled_from(["input", "parameters", "output", "parameters_grad"]),
    st.one_of(st.none(), st.sampled_from(["torch.float32", "torch.int64", "<class 'int'>"])),
    st.one_of(st.none(), st.sampled_from(["[]", "[2, 3]", "(2,)"])),
    st.sampled_from([None, "True", "False"]),
    st.one_of(st.none(), st.text(alphabet="0123456789abcdef", min_size=8, max_size=8)),
    st.booleans(),
    st.one_of(st.none(), st.fixed_dictionaries({"op": st.sampled_from(["isend", "irecv"]),
                                                "peer": st.integers(0, 7), "tag": st.integers(0, 3),
                                                "group_id": st.one_of(st.none(), st.integers(0, 2))})),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_row, max_size=6), max_size=8))
def test_built_columns_round_trip(entries: list[list[tuple[Any, ...]]]) -> None:
    builder = ColumnsBuilder()
    for k, rows in enumerate(entries):
        api = f"Torch.op.{k}.forward"
        builder.entry_names.append(api)
        builder.entry_starts.append(len(builder))
        for i, (stats, state, dtype, shape, rg, md5, is_tensor, p2p) in enumerate(rows):
            if p2p is not None:
                builder.p2p[len(builder)] = p2p
            builder.add(f"{api}.input.{i}", state, dtype, shape, rg, stats, md5, None, is_tensor)
    cols = builder.build()
    back = _round_trip(cols)
    assert_same_columns(back, cols)
    for i in range(len(cols)):
        assert _typed(back.stats_of(i)) == _typed(cols.stats_of(i))


def test_nan_payloads_and_signed_zeros_survive_bit_for_bit() -> None:
    odd_nans = [struct.unpack("<d", struct.pack("<Q", bits))[0]
                for bits in (0x7FF8000000000001, 0xFFF8000000000000, 0x7FF4000000000000)]  # fmt: skip
    builder = ColumnsBuilder()
    builder.entry_names.append("Torch.nan.0.forward")
    builder.entry_starts.append(0)
    builder.add("Torch.nan.0.forward.input.0", "input", "torch.float32", "[2]", "False",
                (odd_nans[0], odd_nans[1], -0.0, odd_nans[2]), None, None, True)  # fmt: skip
    builder.add("Torch.nan.0.forward.input.1", "input", "torch.float32", "[2]", "False",
                (odd_nans[1], None, -0.0, 1), None, None, True)  # fmt: skip
    cols = builder.build()
    back = _round_trip(cols)
    assert back.stats.tobytes() == cols.stats.tobytes()
    assert _typed(back.stats_of(0)) == _typed(tuple(odd_nans[:2]) + (-0.0, odd_nans[2]))
    assert _typed(back.odd) == _typed({1: (odd_nans[1], None, -0.0, 1)})


def test_a_sidecar_gives_the_dump_load_dump_gives(tmp_path: Path) -> None:
    from parity.shared.dump.sidecar import SIDECAR_NAME, decode_sidecar, encode_sidecar, read_dump
    from parity.shared.errors import DumpError

    path = _odd_dump(tmp_path)
    parsed = load_dump(path)
    (path.parent / SIDECAR_NAME).write_bytes(encode_sidecar(parsed))
    path.write_text("no longer JSON")  # read_dump must take the sidecar
    again = read_dump(path)
    assert (again.path, again.task, again.level, again.framework, again.has_md5) == (
        parsed.path, parsed.task, parsed.level, parsed.framework, parsed.has_md5)  # fmt: skip
    assert_same_columns(again.columns, parsed.columns)
    with pytest.raises(DumpError, match="unreadable dump.columns"):
        decode_sidecar(b"garbage", path)


def test_a_sidecar_of_an_earlier_version_gives_way_to_its_dump_json(tmp_path: Path) -> None:
    """Sidecars stored before the shapes' dimensions were kept (version 1: one blob of ``(header, wire)``;
    version 2: the columns one by one) are not read: ``read_dump`` parses the dump.json again."""
    import marshal

    from parity.shared.dump.sidecar import (
        SIDECAR_NAME,
        StaleSidecar,
        decode_sidecar,
        read_dump,
        write_sidecar,
    )

    path = _odd_dump(tmp_path)
    parsed = load_dump(path)
    header = ("parity-dump-columns", 1, parsed.task, parsed.level, parsed.framework, parsed.dump_data_dir,
              parsed.has_md5)  # fmt: skip
    old_wire = parsed.columns.to_wire()[:15]
    with pytest.raises(StaleSidecar):
        decode_sidecar(marshal.dumps((header, old_wire)), path)
    v2 = marshal.dumps(("parity-dump-columns", 2, *header[2:])) + b"".join(map(marshal.dumps, old_wire))
    (path.parent / SIDECAR_NAME).write_bytes(v2)
    assert_same_columns(read_dump(path).columns, parsed.columns)
    write_sidecar(parsed, tmp_path / "new.columns")
    new = decode_sidecar((tmp_path / "new.columns").read_bytes(), path).columns
    assert_same_columns(new, parsed.columns)
    assert new.dims == parsed.columns.dims and (2, 0, 3) in new.dims.values()


def test_a_sidecars_header_says_what_its_dump_holds(tmp_path: Path) -> None:
    """What validation records of a run (``runs.dump_task``), from the header alone, in versions 1 and 2."""
    from parity.shared.dump.sidecar import sidecar_task, write_sidecar
    from parity.shared.errors import DumpError

    parsed = load_dump(_odd_dump(tmp_path))
    write_sidecar(parsed, tmp_path / "a.columns")
    assert (parsed.task, parsed.has_md5) == ("statistics", True)
    assert sidecar_task(tmp_path / "a.columns") == "md5"  # statistics with checksums
    for task, md5 in (("statistics", False), ("tensor", False)):
        header = ("parity-dump-columns", 1, task, parsed.level, parsed.framework, None, md5)
        (tmp_path / "v1.columns").write_bytes(marshal.dumps((header, parsed.columns.to_wire())))
        assert sidecar_task(tmp_path / "v1.columns") == task
    (tmp_path / "bad.columns").write_bytes(b"garbage")
    with pytest.raises(DumpError, match="unreadable dump.columns"):
        sidecar_task(tmp_path / "bad.columns")
