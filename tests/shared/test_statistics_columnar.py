"""The column-wise statistics table against the row-at-a-time rules it stands in for.

``statistics_table`` computes the common row with NumPy and formats its percentages with orjson; every cell,
status, message and highlight must be what the row-at-a-time path (``statistics_row``, ``apply_highlights``
over every row) gives, on dumps holding every kind of value a statistics dump can hold.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.headers import CompareMode, full_header
from parity.shared.compare.highlight import apply_highlights
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.pairing import pair_rows
from parity.shared.compare.rows import side_rows
from parity.shared.compare.statistics_table import build_statistics_rows, percent_strings, statistics_row
from parity.shared.dump.reader import load_dump

HEADER = full_header(CompareMode.STATISTICS, stack=False)
RESULT_COL = HEADER.index("Result")

# ----------------------------------------------------------------------------------------------------------
# percent_strings


@pytest.mark.parametrize(
    "value",
    [0.0, 5e-324, 1e-300, 9.999999999999999e-05, 1e-4, 1.0000000000000002e-4, 0.1, 1.0, 123.0, 12.5,
     9999999999999998.0, 1e16, 1.0000000000000002e16, 1e300, 1.7976931348623157e308, math.inf],
)  # fmt: skip
def test_percent_strings_match_python_at_the_edges(value: float) -> None:
    assert percent_strings(np.array([value])) == [f"{value}%"]


def test_percent_strings_of_nothing() -> None:
    assert percent_strings(np.array([], dtype=np.float64)) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, allow_nan=False, allow_infinity=True), max_size=200))
def test_percent_strings_match_python_formatting(values: list[float]) -> None:
    array = np.array(values, dtype=np.float64)
    assert percent_strings(array) == [f"{x}%" for x in array.tolist()]


def test_percent_strings_on_a_million_random_magnitudes() -> None:
    rng = np.random.default_rng(7)
    values = np.abs(rng.standard_normal(1_000_000)) * 10.0 ** rng.integers(-12, 20, 1_000_000)
    assert percent_strings(values) == [f"{x}%" for x in values.tolist()]


# ----------------------------------------------------------------------------------------------------------
# messy dump pairs


def _stat(rnd: random.Random, allow_nan: bool) -> Any:
    r = rnd.random()
    if r < 0.75:
        return rnd.gauss(0, 1) * 10 ** rnd.randint(-9, 12)
    choices: list[Any] = [0.0, -0.0, 3, -2, None, True, False, "x", 1e308, -1e308, 5e-324, 2**70]
    if allow_nan:
        choices += [math.nan, math.inf, -math.inf]
    return rnd.choice(choices)


def _tensor(rnd: random.Random, allow_nan: bool) -> dict[str, Any]:
    dtype = rnd.choice(["torch.float32"] * 6 + ["torch.int64"])
    rec: dict[str, Any] = {"type": "torch.Tensor", "dtype": dtype, "shape": rnd.choice([[2, 3], [4], []]),
                           "requires_grad": rnd.random() < 0.5}  # fmt: skip
    for key in ("Max", "Min", "Mean", "Norm"):
        if rnd.random() > 0.03:
            rec[key] = _stat(rnd, allow_nan)
    return rec


def _arg(rnd: random.Random, allow_nan: bool) -> Any:
    r = rnd.random()
    if r < 0.75:
        return _tensor(rnd, allow_nan)
    if r < 0.9:
        return {"type": "int", "value": rnd.randint(0, 2)}
    if r < 0.95:
        return None
    return [_tensor(rnd, allow_nan), {"type": "str", "value": "mean"}]


def _perturb(rnd: random.Random, node: Any, allow_nan: bool) -> None:
    if isinstance(node, list):
        for item in node:
            _perturb(rnd, item, allow_nan)
        return
    if not isinstance(node, dict):
        return
    for key in ("Max", "Min", "Mean", "Norm"):
        value = node.get(key)
        if type(value) is float and rnd.random() < 0.7:
            scaled = value * (1 + rnd.choice([1e-6, 1e-3, 0.05, 0.3, 3.0, -2.0]) * rnd.random())
            if allow_nan or math.isfinite(scaled):
                node[key] = scaled
    if "requires_grad" in node and rnd.random() < 0.03:
        node["requires_grad"] = not node["requires_grad"]
    if "dtype" in node and rnd.random() < 0.03:
        node["dtype"] = "torch.int32"
    if node.get("type") == "int" and rnd.random() < 0.1:
        node["value"] += 1
    for value in node.values():
        _perturb(rnd, value, allow_nan)


def _messy_pair(tmp_path: Path, seed: int, allow_nan: bool) -> tuple[Path, Path]:
    rnd = random.Random(seed)
    entries: dict[str, Any] = {}
    for i in range(400):
        direction = rnd.choice(["forward", "forward", "backward"])
        name = f"{rnd.choice(['Torch.add', 'Functional.linear', 'Tensor.__mul__'])}.{i}.{direction}"
        entries[name] = {"input_args": [_arg(rnd, allow_nan) for _ in range(rnd.randint(0, 3))],
                         "input_kwargs": {"alpha": _arg(rnd, allow_nan)} if rnd.random() < 0.2 else {},
                         "output": [_tensor(rnd, allow_nan) for _ in range(rnd.randint(0, 2))]}  # fmt: skip
    paths = []
    for side in ("npu", "bench"):
        data = {}
        for name, entry in entries.items():
            if rnd.random() < 0.03:
                continue  # this entry is on the other side only
            copy = json.loads(json.dumps(entry))
            if side == "bench":
                _perturb(rnd, copy, allow_nan)
            data[name] = copy
        if side == "bench":
            data["Torch.extra.0.forward"] = {
                "input_args": [_tensor(rnd, allow_nan)],
                "output": [_tensor(rnd, allow_nan)],
            }
        doc = {
            "task": "statistics",
            "level": "L1",
            "framework": "pytorch",
            "dump_data_dir": None,
            "data": data,
        }
        path = tmp_path / side / "dump.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc, allow_nan=allow_nan))
        paths.append(path)
    return paths[0], paths[1]


@pytest.mark.parametrize("fuzzy", [False, True])
@pytest.mark.parametrize(("seed", "allow_nan"), [(1, True), (2, False), (3, True)])
def test_engine_rows_equal_the_row_at_a_time_rules(tmp_path: Path, seed: int, allow_nan: bool, fuzzy: bool
                                                   ) -> None:  # fmt: skip
    npu_path, bench_path = _messy_pair(tmp_path, seed, allow_nan)
    result = compare_dumps(npu_path, bench_path, CompareOptions(fuzzy_match=fuzzy))
    npu, bench = load_dump(npu_path), load_dump(bench_path)
    npu_rows, bench_rows = side_rows(npu, tensor_mode=False), side_rows(bench, tensor_mode=False)
    bench_index = pair_rows(npu_rows, bench_rows, fuzzy=fuzzy).bench_index
    kinds: set[str] = set()
    for i in range(len(npu_rows)):
        j = bench_index[i]
        b_name, b_leaf = (bench_rows.names[j], bench.columns.leaf(j)) if j >= 0 else (None, None)
        expected, messages, _status = statistics_row(npu_rows.names[i], npu.columns.leaf(i), b_name, b_leaf,
                                                     fuzzy)  # fmt: skip
        got = result.rows[i].cells
        assert [repr(c) for c in got[: RESULT_COL + 1]] == [repr(c) for c in expected[: RESULT_COL + 1]], i
        for fragment in messages:
            assert fragment in str(got[HEADER.index("Err_message")])
        kinds.update(type(c).__name__ for c in got[8:24])
    assert {"float", "str", "int"} <= kinds  # the data really mixed numbers and sentinels


@pytest.mark.parametrize("seed", [4, 5])
def test_skipping_quiet_entries_leaves_every_highlight_and_message_as_it_was(
    tmp_path: Path, seed: int
) -> None:
    npu_path, bench_path = _messy_pair(tmp_path, seed, allow_nan=True)
    npu, bench = load_dump(npu_path), load_dump(bench_path)
    npu_rows, bench_rows = side_rows(npu, tensor_mode=False), side_rows(bench, tensor_mode=False)
    bench_index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    ranged = build_statistics_rows(npu_rows, bench_rows, bench_index, fuzzy=False, stack=None)
    full = build_statistics_rows(npu_rows, bench_rows, bench_index, fuzzy=False, stack=None)
    mode = CompareMode.STATISTICS
    apply_highlights(ranged.rows, ranged.states, mode, HEADER, ranged.messages, ranged.highlight_ranges)
    apply_highlights(full.rows, full.states, mode, HEADER, full.messages)
    assert [r.highlight for r in ranged.rows] == [r.highlight for r in full.rows]
    assert ranged.messages == full.messages
    assert any(r.highlight is not None for r in full.rows)
    covered = sum(stop - start for start, stop in ranged.highlight_ranges)
    assert covered < len(full.rows)  # some entries were really skipped


def test_a_clean_pair_needs_no_highlight_pass(tmp_path: Path) -> None:
    leaf = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 2.0, "Min": -1.0,
            "Mean": 0.5, "Norm": 3.0, "requires_grad": False}  # fmt: skip
    data = {f"Torch.add.{i}.forward": {"input_args": [leaf, leaf], "output": [leaf]} for i in range(50)}
    for side in ("npu", "bench"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "dump.json").write_text(json.dumps({"task": "statistics", "data": data}))
    npu, bench = load_dump(tmp_path / "npu" / "dump.json"), load_dump(tmp_path / "bench" / "dump.json")
    npu_rows, bench_rows = side_rows(npu, tensor_mode=False), side_rows(bench, tensor_mode=False)
    index = pair_rows(npu_rows, bench_rows, fuzzy=False).bench_index
    table = build_statistics_rows(npu_rows, bench_rows, index, fuzzy=False, stack=None)
    assert table.highlight_ranges == []
    assert all(row.cells[HEADER.index("MaxRelativeErr")] == "0.0%" for row in table.rows)
