"""The calls a rank task stores: the engine's records from the rows' facts, equal to what the legacy path
builds from the stored cells for a comparison finished before the tasks stored calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from parity.server.services.calls import summarize_rows
from parity.shared.compare.call_records import call_records
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import json_cells

from tests.factories import DumpBuilder


def _pair(task: str) -> tuple[DumpBuilder, DumpBuilder]:
    rng = np.random.default_rng(4)
    npu, bench = DumpBuilder(task), DumpBuilder(task)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    y = x @ w
    bad = (y * (1 + 1e-2 * rng.standard_normal(y.shape))).astype(np.float32)
    npu.api("Functional.linear.0.forward", [x, w], [bad])
    bench.api("Functional.linear.0.forward", [x, w], [y])
    npu.api("Torch.tanh.0.forward", [bad], [np.tanh(bad)])
    bench.api("Torch.tanh.0.forward", [y], [np.tanh(y)])
    npu.api("Torch.zero.0.forward", [x], [np.zeros_like(x)])
    bench.api("Torch.zero.0.forward", [x], [np.zeros_like(x)])
    npu.api("Torch.only.0.forward", [x], [x])
    return npu, bench


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_the_engines_call_records_equal_those_built_from_the_stored_cells(tmp_path: Path, task: str) -> None:
    npu, bench = _pair(task)
    result = compare_dumps(npu.write(tmp_path / "npu"), bench.write(tmp_path / "bench"),
                           CompareOptions(replay_top=0))  # fmt: skip
    stored = ((i, row.api, row.status.value, str(row.cells[0]), orjson.dumps(json_cells(row.cells)).decode())
              for i, row in enumerate(result.rows))  # fmt: skip
    legacy, _counts = summarize_rows(result.header, stored)
    records = call_records(result)
    assert [r["api"] for r in records] == [r["api"] for r in legacy]
    assert records[0]["max_rel_err"] is not None and records[0]["max_rel_err"] > 1e-5
    for new, old in zip(records, legacy, strict=True):
        assert new.keys() == old.keys()
        for key in new:
            if isinstance(old[key], float):
                assert new[key] == pytest.approx(old[key], rel=1e-9, abs=1e-12), (new["api"], key)
            else:
                assert new[key] == old[key], (new["api"], key)
