"""Rows from dump entries (compare.md §2): names, order, tensor-mode names from data_name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from parity.shared.compare.rows import data_file, side_rows
from parity.shared.dump.reader import load_dump

from tests.factories import DumpBuilder, stats_leaf, write_raw_dump


def test_statistics_rows_follow_dump_order_and_carry_their_entry(tmp_path: Path) -> None:
    t = stats_leaf(1.0, 0.0, 0.5, 1.0)
    data = {"Torch.b.0.forward": {"input_args": [t], "output": [t]}, "Torch.a.0.forward": {"output": [t]}}
    rows = side_rows(load_dump(write_raw_dump(tmp_path, data)), tensor_mode=False)
    assert rows.names == [
        "Torch.b.0.forward.input.0",
        "Torch.b.0.forward.output.0",
        "Torch.a.0.forward.output.0",
    ]
    assert rows.apis == ["Torch.b.0.forward", "Torch.b.0.forward", "Torch.a.0.forward"]


def test_tensor_mode_names_come_from_data_name(tmp_path: Path) -> None:
    builder = DumpBuilder("tensor")
    builder.api(
        "Functional.linear.0.forward",
        inputs=[np.ones(2, np.float32), 3],
        kwargs={"bias": np.ones(2)},
        outputs=[np.ones(2, np.float32)],
    )
    rows = side_rows(load_dump(builder.write(tmp_path)), tensor_mode=True)
    assert rows.names == [
        "Functional.linear.0.forward.input.0",
        "Functional.linear.0.forward.input.1",  # the scalar: no file, the recursion name
        "Functional.linear.0.forward.kwargs.bias",  # the file's name, msprobe's tensor-mode row name
        "Functional.linear.0.forward.output.0",
    ]
    assert [data_file(leaf) for leaf in rows.leaves] == [
        "Functional.linear.0.forward.input.0.pt",
        "-1",
        "Functional.linear.0.forward.kwargs.bias.pt",
        "Functional.linear.0.forward.output.0.pt",
    ]


def test_statistics_mode_ignores_data_name(tmp_path: Path) -> None:
    leaf = stats_leaf(1.0, 0.0, 0.5, 1.0) | {"data_name": "Torch.f.0.forward.kwargs.x.pt"}
    rows = side_rows(
        load_dump(write_raw_dump(tmp_path, {"Torch.f.0.forward": {"input_kwargs": {"x": leaf}}})),
        tensor_mode=False,
    )
    assert rows.names == ["Torch.f.0.forward.input.x"]
