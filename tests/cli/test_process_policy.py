"""``parity.process_policy``: the collector policy the entry points apply around a compare (moved out of the
library, which must leave process-wide state alone)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from parity.shared.dump.reader import load_dump
from parity.shared.errors import DumpError

from parity.process_policy import collector_paused
from tests.factories import stats_leaf, write_raw_dump


@pytest.fixture
def gc_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


def _big_dump(directory: Path, n: int = 1000) -> Path:
    data = {f"Torch.op{i}.0.forward": {"output": [stats_leaf(i * 0.5, 0.0, 0.25, 1.0)]} for i in range(n)}
    return write_raw_dump(directory, data)


def test_what_a_paused_compare_built_leaves_the_young_generation(tmp_path: Path, gc_enabled: None) -> None:
    path = _big_dump(tmp_path)
    with collector_paused():
        assert not gc.isenabled()
        dump = load_dump(path)
    assert gc.isenabled()
    c = dump.columns
    lists = [c.entry_names, c.names, c.apis, c.states, c.dtypes, c.shapes]
    young = {id(o) for o in gc.get_objects(generation=0)}
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert not [i for i, col in enumerate(lists) if id(col) in young]
    assert all(id(col) in oldest for col in lists)


def test_the_collector_resumes_after_an_error_and_a_callers_choice_is_kept(
    tmp_path: Path, gc_enabled: None
) -> None:
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text("[1]")
    with pytest.raises(DumpError), collector_paused():
        load_dump(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            load_dump(_big_dump(tmp_path / "again", 10))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_metric_executor_is_none_for_one_worker_and_a_shut_pool_after() -> None:
    """The pool the CLI hands to the engine: none for ``-j 1``, threads by default, processes on request;
    shut down when the compare is over, so nothing outlives it."""
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    from parity.process_policy import metric_executor

    with metric_executor(1) as none:
        assert none is None
    with metric_executor(2) as threads:
        assert isinstance(threads, ThreadPoolExecutor)
        assert threads.submit(sum, [1, 2]).result() == 3
    with pytest.raises(RuntimeError, match="shutdown"):
        threads.submit(sum, [1])
    with metric_executor(2, processes=True) as processes:
        assert isinstance(processes, ProcessPoolExecutor)
        assert processes.submit(sum, [1, 2]).result() == 3
    with pytest.raises(RuntimeError, match="shutdown"):
        processes.submit(sum, [1])


def _spec_with_npu_tensors(tmp_path: Path, sizes: list[int]):  # type: ignore[no-untyped-def]
    """A single-rank compare.json whose NPU tensor folder holds sparse files of ``sizes`` bytes (the
    warm-up's estimate reads sizes only, so nothing is written to disk)."""
    from parity.shared.compare.spec import parse_compare_spec

    for side in ("npu", "bench"):
        tensors = tmp_path / side / "dump_tensor_data"
        tensors.mkdir(parents=True)
        (tmp_path / side / "dump.json").write_text("{}")
        for i, size in enumerate(sizes):
            with (tensors / f"t{i}.pt").open("wb") as fh:
                fh.truncate(size)
    return parse_compare_spec(
        {"npu_path": str(tmp_path / "npu" / "dump.json"), "bench_path": str(tmp_path / "bench" / "dump.json")}
    )


def test_the_kernel_warms_up_early_only_for_a_compare_that_will_use_it(tmp_path: Path) -> None:
    """``parity compare`` starts loading numba as soon as compare.json is read, but only where the tensors
    reach the size at which ``metrics.parallel`` takes the kernel; a small compare never pays for numba."""
    import sys

    from parity.shared.metrics.parallel import COMPILED_FROM_BYTES

    from parity.process_policy import warm_kernel_if_large

    statistics = _spec_with_npu_tensors(tmp_path / "statistics", [])
    (tmp_path / "statistics" / "npu" / "dump_tensor_data").rmdir()
    assert warm_kernel_if_large(statistics) is None
    assert warm_kernel_if_large(_spec_with_npu_tensors(tmp_path / "small", [1024, 4096])) is None
    half = COMPILED_FROM_BYTES // 2
    just_under = _spec_with_npu_tensors(tmp_path / "just-under", [half // 2, half // 2 - 1])
    assert warm_kernel_if_large(just_under) is None
    thread = warm_kernel_if_large(_spec_with_npu_tensors(tmp_path / "large", [half // 2, half // 2]))
    assert thread is not None and thread.daemon
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "parity.shared.metrics.kernel" in sys.modules


def test_the_warm_up_estimate_is_bounded_and_ignores_a_missing_folder(tmp_path: Path) -> None:
    """Many small files stop the estimate undecided (no warm-up) instead of a scan of the whole dump; a
    statistics dump (no tensor folder) and a folder past the bound never start it."""
    from parity.process_policy import _WARM_UP_SCAN_ENTRIES, _holds_at_least

    many = tmp_path / "many"
    many.mkdir()
    for i in range(_WARM_UP_SCAN_ENTRIES + 1):
        (many / f"{i}.pt").touch()
    with (many / "zz-large.pt").open("wb") as fh:  # scandir's order is the file system's: it may come first
        fh.truncate(1 << 30)
    assert _holds_at_least([tmp_path / "absent"], 1) is False
    assert _holds_at_least([many], 1 << 40) is False
    assert _holds_at_least([tmp_path / "absent", many], 0) is True
