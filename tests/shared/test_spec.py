"""compare.json parsing: the accepted forms, and a one-line error naming key and path for each bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from parity.shared.compare.spec import SpecKind, load_compare_spec, parse_compare_spec
from parity.shared.errors import CompareInputError, DumpError


def dump_file(root: Path, name: str = "dump.json") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    path.write_text('{"task": "statistics", "level": "L1", "data": {}}')
    return path


def step_dir(root: Path, ranks=(0,)) -> Path:
    for rank in ranks:
        dump_file(root / f"rank{rank}")
    return root


def write_spec(tmp_path: Path, doc) -> Path:
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_single_rank_with_stack(tmp_path):
    npu, bench = dump_file(tmp_path / "npu"), dump_file(tmp_path / "gpu")
    stack = tmp_path / "npu" / "stack.json"
    stack.write_text("{}")
    doc = {"npu_path": str(npu), "bench_path": str(bench), "stack_path": str(stack)}
    doc["is_print_compare_log"] = False
    spec = load_compare_spec(write_spec(tmp_path, doc))
    assert (spec.npu_path, spec.bench_path, spec.stack_path) == (npu, bench, stack)
    assert spec.kind is SpecKind.SINGLE_RANK and not spec.is_print_compare_log


def test_defaults_and_relative_paths_from_the_current_directory(tmp_path, monkeypatch):
    dump_file(tmp_path / "npu")
    dump_file(tmp_path / "gpu", "x_dump.json")
    monkeypatch.chdir(tmp_path)
    spec = parse_compare_spec({"npu_path": "npu/dump.json", "bench_path": "gpu/x_dump.json"})
    assert spec.stack_path is None and spec.is_print_compare_log is True
    assert spec.npu_path.resolve() == (tmp_path / "npu" / "dump.json").resolve()


def test_multi_rank_step_directories_and_ignored_stack_path(tmp_path, caplog):
    npu, bench = step_dir(tmp_path / "npu" / "step0", (0, 1)), step_dir(tmp_path / "gpu" / "step0", (0,))
    stack = dump_file(tmp_path, "stack.json")
    with caplog.at_level(logging.WARNING):
        spec = parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench), "stack_path": str(stack)})
    assert spec.kind is SpecKind.MULTI_RANK and spec.multi_rank and spec.stack_path is None
    assert "'stack_path' is ignored" in caplog.text


def test_unknown_keys_warn_with_a_hint_and_mindspore_keys_are_ignored(tmp_path, caplog):
    npu, bench = dump_file(tmp_path / "npu"), dump_file(tmp_path / "gpu")
    with caplog.at_level(logging.WARNING):
        parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench), "stack_pth": "x", "rank_id": 0})
    assert "unknown key 'stack_pth' is ignored (did you mean 'stack_path'?)" in caplog.text
    assert "'rank_id' is MindSpore-only" in caplog.text


def test_missing_compare_json(tmp_path):
    with pytest.raises(DumpError, match=r"nope\.json: compare\.json not found"):
        load_compare_spec(tmp_path / "nope.json")


def test_compare_json_is_a_directory(tmp_path):
    with pytest.raises(CompareInputError, match="is a directory, expected a compare.json file"):
        load_compare_spec(tmp_path)


def test_malformed_json_names_line_and_column(tmp_path):
    path = write_spec(tmp_path, '{\n  "npu_path": "a",\n  "bench_path" "b"\n}')
    with pytest.raises(DumpError, match=r"compare\.json: line 3 column 16: malformed JSON: Expecting ':'"):
        load_compare_spec(path)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], "must be a JSON object"),
        ({"bench_path": "x"}, "missing required key 'npu_path'"),
        ({"npu_path": "x"}, "missing required key 'bench_path'"),
        ({"npu_path": 3, "bench_path": "x"}, "'npu_path' must be a non-empty path string, got 3"),
        ({"npu_path": "", "bench_path": "x"}, "'npu_path' must be a non-empty path string"),
    ],
)
def test_bad_documents(doc, message):
    with pytest.raises(CompareInputError, match=message):
        parse_compare_spec(doc)


def test_missing_dump_file_is_named(tmp_path):
    bench = dump_file(tmp_path / "gpu")
    missing = tmp_path / "npu" / "dump.json"
    with pytest.raises(CompareInputError, match=rf"'npu_path' {missing} does not exist"):
        parse_compare_spec({"npu_path": str(missing), "bench_path": str(bench)})


def test_file_and_directory_mixed(tmp_path):
    npu, bench = dump_file(tmp_path / "npu"), step_dir(tmp_path / "gpu" / "step0")
    with pytest.raises(CompareInputError, match=rf"same type .* '{'npu_path'}' {npu} is a file"):
        parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench)})


def test_file_not_named_dump_json(tmp_path):
    npu, bench = dump_file(tmp_path / "npu", "data.json"), dump_file(tmp_path / "gpu")
    with pytest.raises(
        CompareInputError, match=r"'npu_path' .*data\.json must be a file whose name ends with dump"
    ):
        parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench)})


def test_step_directory_without_ranks(tmp_path):
    npu, bench = step_dir(tmp_path / "npu" / "step0"), tmp_path / "gpu" / "step0"
    bench.mkdir(parents=True)
    with pytest.raises(CompareInputError, match=r"'bench_path': .*step0: no rank\* directory found"):
        parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench)})


def test_stack_path_problems(tmp_path):
    npu, bench = dump_file(tmp_path / "npu"), dump_file(tmp_path / "gpu")
    with pytest.raises(CompareInputError, match="'stack_path' .* does not exist"):
        parse_compare_spec(
            {"npu_path": str(npu), "bench_path": str(bench), "stack_path": str(tmp_path / "s")}
        )
    with pytest.raises(CompareInputError, match="'stack_path' .* is a directory, expected a stack.json file"):
        parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench), "stack_path": str(tmp_path)})


def test_is_print_compare_log_must_be_a_bool(tmp_path):
    npu, bench = dump_file(tmp_path / "npu"), dump_file(tmp_path / "gpu")
    with pytest.raises(CompareInputError, match="'is_print_compare_log' must be true or false, got 'yes'"):
        parse_compare_spec({"npu_path": str(npu), "bench_path": str(bench), "is_print_compare_log": "yes"})
