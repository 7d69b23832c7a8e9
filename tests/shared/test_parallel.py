"""The parallel executor: every index exactly once, the same numbers as the serial pass, file cases.

The pools come from ``parity.process_policy.metric_executor``, as the entry points build them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from parity.shared.errors import UnsafeFileError
from parity.shared.metrics import parallel
from parity.shared.metrics.parallel import TensorPairJob, compare_pair_files, compare_tensor_files
from parity.shared.metrics.tensor import TensorMetrics, compare_arrays

from parity.process_policy import metric_executor


def _write_pairs(tmp_path: Path, sizes: list[int]) -> list[TensorPairJob]:
    gen = torch.Generator().manual_seed(7)
    jobs = []
    for i, size in enumerate(sizes):
        n = torch.randn(size, generator=gen)
        b = n * (1 + 1e-3 * torch.randn(size, generator=gen))
        dtype = [torch.float32, torch.float16, torch.bfloat16, torch.float64][i % 4]
        torch.save(n.to(dtype), tmp_path / f"n{i}.pt")
        torch.save(b.to(dtype), tmp_path / f"b{i}.pt")
        jobs.append(TensorPairJob(100 + i, tmp_path / f"n{i}.pt", tmp_path / f"b{i}.pt"))
    return jobs


def _expected(job: TensorPairJob) -> TensorMetrics:
    from parity.shared.tensor_io import load_tensor

    assert job.npu_file is not None and job.bench_file is not None
    return compare_arrays(load_tensor(job.npu_file), load_tensor(job.bench_file))


SIZES = [3, 50_000, 1, 7, 120_000, 2_000, 64, 9_999]


@pytest.mark.parametrize("mode", ["serial", "threads", "processes"])
def test_every_index_once_and_equal_to_serial(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _write_pairs(tmp_path, SIZES)
    monkeypatch.setattr(parallel, "SERIAL_BYTES", 0)
    ticks: list[int] = []
    with metric_executor(1 if mode == "serial" else 2, processes=mode == "processes") as executor:
        assert (executor is None) == (mode == "serial")
        results = list(compare_tensor_files(jobs, executor=executor, progress=ticks.append))
    indices = [index for index, _ in results]
    assert sorted(indices) == [job.index for job in jobs]  # each exactly once
    assert sum(ticks) == len(jobs)
    got = dict(results)
    for job in jobs:
        assert got[job.index] == _expected(job), job


def test_no_data_file_and_missing_file_cases(tmp_path: Path) -> None:
    torch.save(torch.ones(3), tmp_path / "ok.pt")
    assert compare_pair_files(None, tmp_path / "ok.pt") == TensorMetrics.all_cells(
        "unsupported", "NPU does not have data file.")  # fmt: skip
    assert compare_pair_files(tmp_path / "ok.pt", None) == TensorMetrics.all_cells(
        "unsupported", "Bench does not have data file.")  # fmt: skip
    gone = tmp_path / "Torch.mul.0.forward.output.0.pt"
    missing = compare_pair_files(tmp_path / "ok.pt", gone)
    assert missing == dataclasses.replace(TensorMetrics.all_cells(
        "unsupported", "Dump file: Torch.mul.0.forward.output.0.pt not found or read failed."),
        unread_file=str(gone))  # fmt: skip
    (tmp_path / "broken.pt").write_bytes(b"garbage")
    broken = compare_pair_files(tmp_path / "broken.pt", tmp_path / "ok.pt")
    assert broken.messages == ("Dump file: broken.pt not found or read failed.",)
    assert broken.unread_file == str(tmp_path / "broken.pt")  # the side that failed, though names are alike


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_pickle_payload_in_a_process_pool_raises_in_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _write_pairs(tmp_path, [1000, 2000])
    marker = tmp_path / "marker"
    torch.save(_Payload(marker), tmp_path / "evil.pt")
    jobs.append(TensorPairJob(9, tmp_path / "evil.pt", jobs[0].bench_file))
    monkeypatch.setattr(parallel, "SERIAL_BYTES", 0)
    with pytest.raises(UnsafeFileError, match="evil.pt"), metric_executor(2, processes=True) as executor:
        list(compare_tensor_files(jobs, executor=executor))
    assert not marker.exists()


def test_stopping_early_shuts_the_pool_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "SERIAL_BYTES", 0)
    jobs = _write_pairs(tmp_path, [5000] * 12)
    with metric_executor(2) as executor:
        stream = compare_tensor_files(jobs, executor=executor)
        first = next(stream)
        stream.close()
    assert first[0] in {job.index for job in jobs}


def test_largest_pairs_are_submitted_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "SERIAL_BYTES", 0)
    jobs = _write_pairs(tmp_path, [10, 100_000, 1_000, 50_000])
    submitted: list[int] = []
    real = parallel._run_job

    def spy(job: TensorPairJob, max_bytes: int | None, compiled: bool | None = None) -> object:
        submitted.append(job.index)
        return real(job, max_bytes, compiled)

    monkeypatch.setattr(parallel, "_run_job", spy)
    with metric_executor(2) as executor:
        list(compare_tensor_files(jobs, executor=executor))
    by_size = sorted(jobs, key=lambda j: -(os.path.getsize(j.npu_file or "") * 1.0))
    # the two largest start first (on the two threads), whatever order they finish in
    assert set(submitted[:2]) == {by_size[0].index, by_size[1].index}
    assert np.isin(submitted, [j.index for j in jobs]).all()


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_the_engine_gives_the_same_rows_with_and_without_a_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: bool
) -> None:
    """The executor an entry point hands in (``CompareOptions.executor``) changes where the metrics run, never
    a cell: a whole tensor-mode compare, serial and on a pool."""
    from parity.shared.compare.engine import compare_dumps
    from parity.shared.compare.options import CompareOptions

    from tests.factories import DumpBuilder

    rng = np.random.default_rng(3)
    sides = {"npu": DumpBuilder("tensor"), "bench": DumpBuilder("tensor")}
    for i, size in enumerate([1, 7, 3000, 70_000, 200]):
        x = rng.standard_normal(size).astype(np.float32)
        y = x * np.float32(1 + 1e-3 * (i % 3))
        if i == 2:
            y[5] = np.nan  # a NaN/Inf position mismatch on one row
        sides["npu"].api(f"Torch.op{i}.0.forward", inputs=[x], outputs=[x * 2])
        sides["bench"].api(f"Torch.op{i}.0.forward", inputs=[x], outputs=[y * 2])
    for side, builder in sides.items():
        builder.write(tmp_path / side)
    npu, bench = tmp_path / "npu" / "dump.json", tmp_path / "bench" / "dump.json"
    serial = compare_dumps(npu, bench, CompareOptions())
    monkeypatch.setattr(parallel, "SERIAL_BYTES", 0)
    with metric_executor(2, processes=processes) as executor:
        assert executor is not None
        pooled = compare_dumps(npu, bench, CompareOptions(executor=executor))
    assert [row.cells for row in pooled.rows] == [row.cells for row in serial.rows]
    assert [row.status for row in pooled.rows] == [row.status for row in serial.rows]
    assert len(serial.rows) == 10


def test_numba_is_loaded_only_for_a_compare_large_enough(tmp_path: Path) -> None:
    """Without the C kernel, one choice a compare (``COMPILED_FROM_BYTES``): a few pairs of 70k elements
    (each above the numpy pass's default per-pair limit) in a small compare stay on numpy; the same pairs
    with the threshold at 0 load numba's kernel; the cells are the same."""
    import json
    import subprocess
    import sys

    jobs = _write_pairs(tmp_path, [70_000, 70_000, 100])
    code = (
        "import json, sys\n"
        "sys.modules['parity.shared.metrics._fused'] = None\n"  # as if the C module had not been built
        "from parity.shared.metrics import parallel\n"
        "jobs = [parallel.TensorPairJob(i, n, b) for i, n, b in json.loads(sys.argv[1])]\n"
        "parallel.COMPILED_FROM_BYTES = int(sys.argv[2])\n"
        "out = sorted(parallel.compare_tensor_files(jobs), key=lambda item: item[0])\n"
        "print('numba' in sys.modules)\n"
        "print(repr([m for _, m in out]))\n"
    )
    spec = json.dumps([(job.index, str(job.npu_file), str(job.bench_file)) for job in jobs])
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, spec, str(threshold)], capture_output=True, text=True, check=True
        ).stdout.splitlines()  # fmt: skip
        for threshold in (parallel.COMPILED_FROM_BYTES, 0)
    ]
    assert [run[0] for run in runs] == ["False", "True"]
    assert runs[0][1] == runs[1][1]
