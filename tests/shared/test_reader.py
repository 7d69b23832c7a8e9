"""The dump reader: dump.json, stack.json, construct.json and the rank layout (dump-format.md §3-§5)."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
from parity.shared.dump.layout import (
    find_dump_ranks,
    find_rank_dirs,
    parse_stored_path,
    rank_dir_path,
    rank_number,
    sibling_stack_json,
    stored_prefix,
)
from parity.shared.dump.reader import load_construct, load_dump, load_stack
from parity.shared.errors import CompareInputError, DumpError

from tests.factories import stats_leaf, write_raw_dump


def _leaves(tmp_path: Path, entry: dict[str, Any], name: str = "Torch.f.0.forward") -> dict[str, Any]:
    dump = load_dump(write_raw_dump(tmp_path, {name: entry}))
    return {leaf.name: leaf for leaf in dump.entries[0].leaves}


def test_header_fields_and_entry_order(tmp_path: Path) -> None:
    data = {f"Torch.op{i}.0.forward": {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0)]} for i in (3, 1, 2)}
    dump = load_dump(write_raw_dump(tmp_path, data))
    assert (dump.task, dump.level, dump.framework) == ("statistics", "L1", "pytorch")
    assert [e.name for e in dump.entries] == [
        "Torch.op3.0.forward",
        "Torch.op1.0.forward",
        "Torch.op2.0.forward",
    ]


def test_bare_nan_and_infinity_tokens(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(
        '{"task": "statistics", "data": {"Torch.f.0.forward": {"output": [{"type": "torch.Tensor", '
        '"dtype": "torch.float32", "shape": [2], "Max": Infinity, "Min": -Infinity, "Mean": NaN, '
        '"Norm": NaN, "requires_grad": false}]}}}'
    )
    leaf = load_dump(path).entries[0].leaves[0]
    assert leaf.max == math.inf and leaf.min == -math.inf and math.isnan(leaf.mean)


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63), 1.5])  # the extremes of torch's integer dtypes
def test_statistics_are_read_exactly(tmp_path: Path, value: float) -> None:
    path = tmp_path / "dump.json"
    path.write_text(
        '{"task": "statistics", "data": {"Torch.f.0.forward": {"output": [{"type": "torch.Tensor", '
        f'"dtype": "torch.int64", "shape": [2], "Max": {value}, "Min": 0, "Mean": 1.25, '
        '"Norm": 3.0, "requires_grad": false}]}}}'
    )
    (leaf,) = load_dump(path).entries[0].leaves
    assert (leaf.max, leaf.min, leaf.mean, leaf.norm) == (value, 0, 1.25, 3.0)
    assert type(leaf.max) is type(value)


def test_missing_mean_and_norm_are_none(tmp_path: Path) -> None:
    rec = {"type": "torch.Tensor", "dtype": "torch.bool", "shape": [3], "Max": True, "Min": False}
    leaf = _leaves(tmp_path, {"output": [rec]})["Torch.f.0.forward.output.0"]
    assert (leaf.max, leaf.min, leaf.mean, leaf.norm) == (True, False, None, None)
    assert leaf.requires_grad is None


def test_null_leaf_is_a_row_with_every_field_none(tmp_path: Path) -> None:
    leaf = _leaves(tmp_path, {"output": [None]})["Torch.f.0.forward.output.0"]
    assert (leaf.dtype, leaf.shape, leaf.max, leaf.md5) == (None, None, None, None)


def test_names_by_index_and_key_recursion_in_row_order(tmp_path: Path) -> None:
    t = stats_leaf(1.0, 0.0, 0.5, 1.0)
    entry = {"output": [t], "input_kwargs": {"bias": t}, "parameters": {"weight": t}, "input_args": [[t, t]]}
    names = list(_leaves(tmp_path, entry))
    assert names == [
        "Torch.f.0.forward.input.0.0",
        "Torch.f.0.forward.input.0.1",
        "Torch.f.0.forward.input.bias",
        "Torch.f.0.forward.parameters.weight",
        "Torch.f.0.forward.output.0",
    ]


def test_empty_containers_and_positional_dtype_yield_no_row(tmp_path: Path) -> None:
    leaves = _leaves(tmp_path, {"input_args": [{}, []], "input_kwargs": {}, "output": []})
    assert leaves == {}


def test_parameters_grad_entry(tmp_path: Path) -> None:
    name = "Module.fc.Linear.parameters_grad.0"
    leaves = _leaves(tmp_path, {"weight": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}, name)
    leaf = leaves[f"{name}.weight"]  # no list index: msprobe names the leaf after the parameter
    assert leaf.state == "parameters_grad"


def test_scalar_leaves(tmp_path: Path) -> None:
    entry = {
        "input_args": [
            {"type": "int", "value": 3},
            {"type": "float", "value": 0.5},
            {"type": "bool", "value": True},
            {"type": "str", "value": "=cmd"},
        ]
    }
    leaves = list(_leaves(tmp_path, entry).values())
    assert [leaf.dtype for leaf in leaves] == [
        "<class 'int'>",
        "<class 'float'>",
        "<class 'bool'>",
        "<class 'str'>",
    ]
    assert all(leaf.shape == "[]" for leaf in leaves)
    assert (leaves[0].max, leaves[0].min, leaves[0].mean, leaves[0].norm) == (3, 3, 3, 3)
    assert leaves[0].md5 == f"{zlib.crc32(b'3'):08x}"
    assert leaves[3].max == "=cmd"  # kept; the report writer escapes it


@pytest.mark.parametrize(
    ("record", "dtype", "shape", "stat"),
    [
        ({"type": "slice", "value": [0, None, 2]}, "slice", "(3,)", None),
        ({"type": "ellipsis", "value": "..."}, "ellipsis", "[]", "..."),
        ({"type": "torch.Size", "value": [2, 3]}, "torch.Size", "[2, 3]", None),
        ({"type": "torch.dtype", "value": "torch.float16"}, "<class 'str'>", "[]", "torch.float16"),
        ({"type": "torch.device", "value": "cpu:None"}, "<class 'str'>", "[]", "cpu:None"),
        ({"type": "torch.memory_format", "format": "channels_last"}, "<class 'str'>", "[]", "channels_last"),
        (
            {"type": "torch.ProcessGroup", "group_ranks": [0, 1], "group_id": "12"},
            "torch.ProcessGroup",
            "[]",
            "[0, 1]",
        ),
        (
            {"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"},
            "<class 'str'>",
            "[]",
            "RedOpType.SUM",
        ),
        ({"type": "float32", "value": 1.5}, "<class 'float'>", "[]", 1.5),
    ],
)
def test_non_tensor_encodings(
    tmp_path: Path, record: dict[str, Any], dtype: str, shape: str, stat: Any
) -> None:
    leaf = _leaves(tmp_path, {"input_args": [record]})["Torch.f.0.forward.input.0"]
    assert (leaf.dtype, leaf.shape, leaf.max) == (dtype, shape, stat)
    assert leaf.is_tensor is False


def test_numpy_ndarray_is_tensor_like(tmp_path: Path) -> None:
    rec = {
        "type": "numpy.ndarray",
        "dtype": "float32",
        "shape": [2],
        "Max": 2.0,
        "Min": 1.0,
        "Mean": 1.5,
        "Norm": 2.2,
    }
    leaf = _leaves(tmp_path, {"input_args": [rec]})["Torch.f.0.forward.input.0"]
    assert (leaf.dtype, leaf.shape, leaf.max, leaf.is_tensor) == ("float32", "[2]", 2.0, True)


def test_p2pop_leaf_keeps_op_and_peer(tmp_path: Path) -> None:
    rec = {
        "class_type": "torch.distributed.P2POp",
        "tensor": stats_leaf(1.0, 0.0, 0.5, 1.0),
        "op": "isend",
        "peer": 1,
        "tag": 0,
        "group_id": "7",
    }
    leaf = _leaves(tmp_path, {"input_args": [[rec]]})["Torch.f.0.forward.input.0.0"]
    assert leaf.p2p == {"op": "isend", "peer": 1, "tag": 0, "group_id": "7"}
    assert leaf.dtype == "torch.float32"


def test_src_dst_arguments_keep_their_type(tmp_path: Path) -> None:
    leaf = _leaves(tmp_path, {"input_kwargs": {"dst": {"type": "int", "value": 1}}})[
        "Torch.f.0.forward.input.dst"
    ]
    assert (leaf.dtype, leaf.max) == ("int", 1)


def test_md5_key_marks_the_dump(tmp_path: Path) -> None:
    dump = load_dump(
        write_raw_dump(
            tmp_path, {"Torch.f.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0, md5="0a0b0c0d")]}}
        )
    )
    assert dump.has_md5 and dump.entries[0].leaves[0].md5 == "0a0b0c0d"


def test_malformed_json_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text('{"task": "statistics",\n "data": {,}}')
    with pytest.raises(DumpError, match=r"dump\.json: line 2 column 11: malformed JSON"):
        load_dump(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="dump.json not found"):
        load_dump(tmp_path / "dump.json")


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"type": "torch.Tensor", "dtype": "torch.float32", "shape": "2x3"}, "output.0.shape"),
        (
            {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "requires_grad": "yes"},
            "output.0.requires_grad",
        ),
        ({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": [1]}, "output.0.Max"),
        ({"type": "torch.Tensor", "dtype": 5, "shape": [2]}, "output.0.dtype"),
    ],
)
def test_schema_errors_name_file_entry_and_field(tmp_path: Path, record: dict[str, Any], field: str) -> None:
    path = write_raw_dump(tmp_path, {"Torch.f.0.forward": {"output": [record]}})
    with pytest.raises(DumpError) as info:
        load_dump(path)
    message = str(info.value)
    assert str(path) in message and "entry 'Torch.f.0.forward'" in message
    assert f"field 'Torch.f.0.forward.{field}'" in message


def test_unknown_top_level_schema(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"data": {}}))
    with pytest.raises(DumpError, match="field 'task'"):
        load_dump(path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(DumpError, match="top level must be an object"):
        load_dump(path)


def test_entry_that_is_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="entry 'Torch.f.0.forward': must be an object"):
        load_dump(write_raw_dump(tmp_path, {"Torch.f.0.forward": [1]}))


def test_unflushed_placeholder_is_refused(tmp_path: Path) -> None:
    rec = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "tensor_stat_index": 3}
    with pytest.raises(DumpError, match="never flushed"):
        load_dump(write_raw_dump(tmp_path, {"Torch.f.0.forward": {"output": [rec]}}))


def test_stack_json_new_form(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    path.write_text(
        json.dumps(
            {
                "0": [["Torch.a.0.forward", "Torch.b.0.forward"], ["File a.py, line 1"]],
                "1": [["Torch.c.0.forward"], ["File c.py, line 3", "File d.py, line 4"]],
            }
        )
    )
    stacks = load_stack(path)
    assert stacks["Torch.b.0.forward"] == ["File a.py, line 1"]
    assert stacks["Torch.c.0.forward"] == ["File c.py, line 3", "File d.py, line 4"]


def test_stack_json_old_form(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps({"Torch.a.0.forward": ["File a.py, line 1"]}))
    assert load_stack(path) == {"Torch.a.0.forward": ["File a.py, line 1"]}


def test_stack_json_bad_new_form(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps({"0": ["Torch.a.0.forward"]}))
    with pytest.raises(DumpError, match="stack '0'"):
        load_stack(path)


def test_construct_json_normalises_parents(tmp_path: Path) -> None:
    path = tmp_path / "construct.json"
    path.write_text(
        json.dumps(
            {
                "Module.a.A.forward.0": None,
                "Torch.x.0.forward": "Module.a.A.forward.0",
                "Module.b.B.forward.0": "",
                "Torch.y.0.forward": ["Module.b.B.forward.0", 1],
                "megatron_micro_step_number": 2,
            }
        )
    )
    assert load_construct(path) == {
        "Module.a.A.forward.0": None,
        "Torch.x.0.forward": "Module.a.A.forward.0",
        "Module.b.B.forward.0": None,
        "Torch.y.0.forward": "Module.b.B.forward.0",
    }


def test_rank_dirs_sorted_by_number_other_entries_ignored(tmp_path: Path) -> None:
    for name in ("rank10", "rank2", "rank0", "rank01", "notes", "rankx"):
        (tmp_path / name).mkdir()
    (tmp_path / "rank3").write_text("a file, not a dir")
    assert [r.rank for r in find_rank_dirs(tmp_path)] == [0, 2, 10]


def test_single_proc_dir_is_a_rank(tmp_path: Path) -> None:
    (tmp_path / "proc4242").mkdir()
    (found,) = find_rank_dirs(tmp_path)
    assert found.rank is None and found.dump_json == tmp_path / "proc4242" / "dump.json"


def test_several_proc_dirs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "proc1").mkdir()
    (tmp_path / "proc2").mkdir()
    with pytest.raises(CompareInputError, match="several proc"):
        find_rank_dirs(tmp_path)


def test_step_dir_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "step0"
    path.write_text("")
    with pytest.raises(CompareInputError, match="is a file"):
        find_rank_dirs(path)


def test_rank_number_and_sibling_stack(tmp_path: Path) -> None:
    assert rank_number("rank7") == 7 and rank_number("rank") is None
    dump_json = write_raw_dump(tmp_path, {})
    assert sibling_stack_json(dump_json) is None
    (tmp_path / "stack.json").write_text("{}")
    assert sibling_stack_json(dump_json) == tmp_path / "stack.json"


def test_tensor_leaf_without_dtype_is_refused(tmp_path: Path) -> None:
    rec = {"type": "torch.Tensor", "shape": [2], "Max": 1.0}
    with pytest.raises(DumpError, match=r"field 'Torch.f.0.forward.output.0.dtype': missing"):
        load_dump(write_raw_dump(tmp_path, {"Torch.f.0.forward": {"output": [rec]}}))


# -- the one layout rule shared by capture, upload, server and compare ---------------------------------


def test_bare_rank_beside_numbered_ranks_is_refused(tmp_path: Path) -> None:
    for name in ("rank", "rank1"):
        (tmp_path / name).mkdir()
    with pytest.raises(CompareInputError, match=r"cannot number its rank folders \(rank, rank1\)"):
        find_rank_dirs(tmp_path)


def test_proc_dirs_beside_rank_dirs_are_skipped(tmp_path: Path) -> None:
    for name in ("rank", "proc12"):
        (tmp_path / name).mkdir()
    (found,) = find_rank_dirs(tmp_path)
    assert found.path.name == "rank" and found.rank is None and found.number == 0
    (tmp_path / "rank").rmdir()
    (tmp_path / "rank3").mkdir()
    assert [(r.path.name, r.number) for r in find_rank_dirs(tmp_path)] == [("rank3", 3)]


def test_find_dump_ranks_from_a_root_a_step_or_a_rank(tmp_path: Path) -> None:
    root = tmp_path / "dump"
    for step, rank in ((0, 0), (0, 1), (2, 0)):
        write_raw_dump(rank_dir_path(root, step, rank), {})
    assert [(s, r.number) for s, r in find_dump_ranks(root)] == [(0, 0), (0, 1), (2, 0)]
    assert [(s, r.number) for s, r in find_dump_ranks(root / "step2")] == [(2, 0)]
    assert [(s, r.number) for s, r in find_dump_ranks(root / "step0" / "rank1")] == [(0, 1)]
    loose = tmp_path / "by-hand"
    write_raw_dump(loose, {})
    assert [(s, r.rank, r.number) for s, r in find_dump_ranks(loose)] == [(0, None, 0)]


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_find_dump_ranks_names_the_folder(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "d"
    if problem == "empty":
        path.mkdir()
    with pytest.raises(CompareInputError, match="not a directory" if problem == "missing" else "no step"):
        find_dump_ranks(path)


def test_stored_paths_round_trip_and_refuse_leading_zeros() -> None:
    assert stored_prefix(3, 12) == "step3/rank12"
    assert parse_stored_path("step3/rank12/dump_tensor_data/x.pt") == (3, 12)
    assert parse_stored_path("step03/rank1/dump.json") is None
    assert parse_stored_path("notes/step0/rank0/dump.json") is None
