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


def test_a_compare_process_ending_without_teardown_loses_no_output(tmp_path: Path) -> None:
    """``exit_without_teardown`` skips the interpreter's teardown, not what the command printed or logged:
    buffered stdout (a pipe), a log file's last line and the exit code all come through."""
    import subprocess
    import sys

    log = tmp_path / "run.log"
    code = (
        "import logging, sys\n"
        f"logging.basicConfig(filename={str(log)!r})\n"
        "print('x' * 100000)\n"
        "sys.stderr.write('to stderr')\n"
        "logging.getLogger('t').warning('the last line')\n"
        "from parity.process_policy import exit_without_teardown\n"
        "exit_without_teardown(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "x" * 100000 + "\n"
    assert proc.stderr == "to stderr"
    assert log.read_text().strip().endswith("the last line")
