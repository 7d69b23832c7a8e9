"""``load_dump_pair``: the bench dump read in a child process must be the dump ``load_dump`` reads here.

Checked field by field on a pair of dumps above ``MIN_PARALLEL_BYTES``; a bad bench dump raises the very
``DumpError`` a read here raises; a child that fails otherwise makes the parent read the file itself (with a
warning); and the fork is taken exactly when asked for, when the files are big enough and when no other
thread runs.
"""

from __future__ import annotations

import json
import logging
import marshal
import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from parity.shared.dump import pair_reader
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.errors import DumpError

from tests.factories import scalar_leaf, stats_leaf

# ----------------------------------------------------------------------------------------------------------
# dumps


def _entry(i: int, salt: int) -> dict[str, Any]:
    """One entry of a statistics dump; ``i`` picks which kinds of leaves it holds."""
    x = (i * 7919 + salt) % 1000 / 7.0
    inputs: list[Any] = [stats_leaf(x, -x, x / 3, 2 * x + 1, requires_grad=i % 2 == 0, shape=(i % 5, 3))]
    kind = i % 9
    if kind == 0:
        inputs.append(stats_leaf(math.nan, -math.inf, math.inf, -0.0))  # bare NaN/Infinity tokens
    elif kind == 1:
        inputs += [stats_leaf(3, 0, 1.5, 2**70, dtype="torch.int64"), scalar_leaf(i % 4), None]
    elif kind == 2:
        inputs += [stats_leaf(True, False, None, None, dtype="torch.bool"), scalar_leaf("mean")]
    elif kind == 3:
        inputs.append({"class_type": "torch.distributed.P2POp", "op": "isend", "peer": i % 8, "tag": i,
                       "group_id": None, "tensor": stats_leaf(1.0, 0.0, 0.5, 1.0)})  # fmt: skip
    elif kind == 4:
        inputs.append(stats_leaf(x, 0.0, 0.0, x, md5=f"{i:08x}") | {"data_name": f"t.{i}.pt"})
    elif kind == 5:
        inputs.append(stats_leaf(None, None, None, None, shape=(0,), requires_grad=None))
    elif kind == 6:
        return {}  # an entry without leaves
    return {"input_args": inputs, "input_kwargs": {"alpha": scalar_leaf(0.5)} if kind == 7 else {},
            "output": [stats_leaf(x + 1, -x - 1, x, 3 * x + 1)]}  # fmt: skip


def _write_dump(path: Path, n_entries: int, *, salt: int = 0, extra: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {}
    for i in range(n_entries):
        direction = "backward" if i % 11 == 10 else "forward"
        data[f"Torch.op{i % 13}.{i}.{direction}"] = _entry(i, salt)
    data["Module.fc.Linear.parameters_grad"] = {"weight": [stats_leaf(0.1, -0.1, 0.0, 0.3)]}
    data.update(extra or {})
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("big")
    npu = _write_dump(root / "npu" / "dump.json", 11_000, salt=1)
    bench = _write_dump(root / "bench" / "dump.json", 12_000, salt=2)
    assert npu.stat().st_size + bench.stat().st_size >= pair_reader.MIN_PARALLEL_BYTES
    return npu, bench


@pytest.fixture
def small_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two small dumps, with the size threshold lowered so that they take the child path."""
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    return (_write_dump(tmp_path / "npu" / "dump.json", 40, salt=3),
            _write_dump(tmp_path / "bench" / "dump.json", 45, salt=4))  # fmt: skip


def assert_same_dump(got: Dump, want: Dump) -> None:
    """Every header field and every column of ``DumpColumns`` equal (NaN placeholders compared as bytes)."""
    header = ("path", "task", "level", "framework", "dump_data_dir", "has_md5")
    for name in header:
        assert getattr(got, name) == getattr(want, name), name
    g, w = got.columns, want.columns
    same = {
        "entry_names": g.entry_names == w.entry_names,
        "names": g.names == w.names,
        "apis": g.apis == w.apis,
        "entry_of": list(g.entry_of) == list(w.entry_of),
        "states": g.states == w.states,
        "dtypes": g.dtypes == w.dtypes,
        "shapes": g.shapes == w.shapes,
        "requires_grads": g.requires_grads == w.requires_grads,
        "stats": g.stats.tobytes() == w.stats.tobytes(),
        "plain": bytes(g.plain) == bytes(w.plain),
        "odd": repr(g.odd) == repr(w.odd),  # repr: NaN inside, and True is not 1
        "md5s": g.md5s == w.md5s,
        "data_names": g.data_names == w.data_names,
        "is_tensor": bytes(g.is_tensor) == bytes(w.is_tensor),
        "p2p": g.p2p == w.p2p,
    }
    assert [name for name, ok in same.items() if not ok] == []
    assert (g.entry_of.typecode, g.stats.typecode) == (w.entry_of.typecode, w.stats.typecode)


# ----------------------------------------------------------------------------------------------------------
# counting children


class _ForkCounter:
    """Wraps ``os.fork`` as pair_reader sees it; counts the forks made by this (the parent) process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real_fork = pair_reader.os.fork

        def fork() -> int:
            pid = real_fork()
            if pid != 0:  # the child leaves through os._exit and never returns here
                self.calls += 1
            return pid

        monkeypatch.setattr(pair_reader.os, "fork", fork)


class _SpawnCounter:
    """Wraps ``subprocess.Popen`` as pair_reader sees it; counts the reader interpreters started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real_popen = pair_reader.subprocess.Popen

        def popen(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real_popen(*args, **kwargs)

        monkeypatch.setattr(pair_reader.subprocess, "Popen", popen)


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> _ForkCounter:
    assert threading.active_count() == 1, "another test left a thread running: no fork would be taken"
    return _ForkCounter(monkeypatch)


@pytest.fixture
def spawns(monkeypatch: pytest.MonkeyPatch) -> _SpawnCounter:
    return _SpawnCounter(monkeypatch)


@pytest.fixture
def second_thread() -> Iterator[threading.Thread]:
    """A second thread, alive until the test ends."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="test-second-thread")
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ----------------------------------------------------------------------------------------------------------
# the same dumps, whichever way they are read


def test_the_forked_read_of_big_dumps_equals_the_serial_read(big_pair: tuple[Path, Path],
                                                             forks: _ForkCounter) -> None:  # fmt: skip
    fds = _open_fds()
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=True)
    assert forks.calls == 1
    assert _open_fds() == fds  # both ends of the pipe closed
    serial_npu, serial_bench = pair_reader.load_dump_pair(*big_pair, parallel=False)
    assert forks.calls == 1
    assert_same_dump(npu, serial_npu)
    assert_same_dump(bench, serial_bench)
    assert_same_dump(bench, load_dump(big_pair[1]))
    # The bench dump really holds every kind of column content that has to make the trip.
    cols = bench.columns
    assert len(cols) > 30_000 and cols.p2p and bench.has_md5
    odd_values = {type(x) for stats in cols.odd.values() for x in stats}
    assert {int, bool, str, type(None), float} <= odd_values
    assert any(math.isnan(x) for x in cols.stats) and math.inf in cols.stats
    assert len(cols.entry_names) > len(set(cols.apis))  # entries without leaves


def test_no_child_when_not_asked(big_pair: tuple[Path, Path], forks: _ForkCounter, spawns: _SpawnCounter
                                 ) -> None:  # fmt: skip
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=False)
    assert (forks.calls, spawns.calls) == (0, 0)
    assert_same_dump(bench, load_dump(big_pair[1]))


def test_no_fork_while_another_thread_runs(big_pair: tuple[Path, Path], forks: _ForkCounter,
                                           spawns: _SpawnCounter, second_thread: threading.Thread
                                           ) -> None:  # fmt: skip
    assert threading.active_count() == 2
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=True)
    assert forks.calls == 0
    assert spawns.calls == 1  # a fresh interpreter reads the bench dump instead
    assert_same_dump(npu, load_dump(big_pair[0]))
    assert_same_dump(bench, load_dump(big_pair[1]))


def test_the_size_threshold_counts_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forks: _ForkCounter, spawns: _SpawnCounter
) -> None:
    npu = _write_dump(tmp_path / "npu" / "dump.json", 30)
    bench = _write_dump(tmp_path / "bench" / "dump.json", 20)
    total = npu.stat().st_size + bench.stat().st_size
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", total + 1)
    pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert (forks.calls, spawns.calls) == (0, 0)
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", total)
    _npu, got = pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert (forks.calls, spawns.calls) == (1, 0)
    assert_same_dump(got, load_dump(bench))


def test_the_real_threshold_keeps_small_dumps_here(tmp_path: Path, forks: _ForkCounter,
                                                   spawns: _SpawnCounter) -> None:  # fmt: skip
    assert pair_reader.MIN_PARALLEL_BYTES == 2 << 20
    npu = _write_dump(tmp_path / "npu" / "dump.json", 300)
    bench = _write_dump(tmp_path / "bench" / "dump.json", 300)
    pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert (forks.calls, spawns.calls) == (0, 0)


# ----------------------------------------------------------------------------------------------------------
# a bad bench dump


def _bad_leaf(**fields: Any) -> dict[str, Any]:
    return {"Torch.bad.0.forward": {"input_args": [stats_leaf(1.0, 0.0, 0.5, 1.0) | fields]}}


BAD_TEXTS = {
    "broken JSON": '{"task": "statistics",\n "data": {"Torch.x.0.forward": }}',
    "top level a list": "[1, 2, 3]",
    "task not a string": '{"task": 3, "data": {}}',
    "not UTF-8": None,  # written as bytes below
}
BAD_ENTRIES = {
    "requires_grad a string": _bad_leaf(requires_grad="yes"),
    "shape not a list": _bad_leaf(shape="2x3"),
    "Max a list": _bad_leaf(Max=[1.0]),
    "md5 a number": _bad_leaf(md5=12),
    "entry not an object": {"Torch.bad.0.forward": [1]},
    "output a number": {"Torch.bad.0.forward": {"output": 7}},
}


def _bad_bench(tmp_path: Path, case: str) -> Path:
    path = tmp_path / "bench" / "dump.json"
    if case in BAD_ENTRIES:
        return _write_dump(path, 20, extra=BAD_ENTRIES[case])
    path.parent.mkdir(parents=True, exist_ok=True)
    text = BAD_TEXTS[case]
    if text is None:
        path.write_bytes(b'{"task": "statistics", "data": {"caf\xe9": {}}}')
    else:
        path.write_text(text)
    return path


def _error_of(read: Any) -> DumpError:
    with pytest.raises(DumpError) as caught:
        read()
    return caught.value


@pytest.mark.parametrize("case", [*BAD_TEXTS, *BAD_ENTRIES])
def test_a_bad_bench_dump_read_by_a_forked_child_raises_the_same_error(
    tmp_path: Path, small_pair: tuple[Path, Path], forks: _ForkCounter, case: str
) -> None:
    npu = small_pair[0]
    bench = _bad_bench(tmp_path, case)
    here = _error_of(lambda: load_dump(bench))
    fds = _open_fds()
    child = _error_of(lambda: pair_reader.load_dump_pair(npu, bench, parallel=True))
    assert forks.calls == 1
    assert _open_fds() == fds
    assert type(child) is type(here)
    assert str(child) == str(here)
    assert (child.file, child.problem, child.where) == (here.file, here.problem, here.where)


@pytest.mark.parametrize("case", ["broken JSON", "requires_grad a string"])
def test_a_bad_bench_dump_read_by_a_spawned_child_raises_the_same_error(
    tmp_path: Path, small_pair: tuple[Path, Path], spawns: _SpawnCounter, second_thread: threading.Thread,
    case: str,
) -> None:  # fmt: skip
    bench = _bad_bench(tmp_path, case)
    here = _error_of(lambda: load_dump(bench))
    child = _error_of(lambda: pair_reader.load_dump_pair(small_pair[0], bench, parallel=True))
    assert spawns.calls == 1
    assert str(child) == str(here)


def test_a_missing_bench_dump_raises_the_same_error(small_pair: tuple[Path, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "dump.json"
    here = _error_of(lambda: load_dump(missing))
    assert str(_error_of(lambda: pair_reader.load_dump_pair(small_pair[0], missing))) == str(here)


def test_a_bad_npu_dump_wins_over_a_good_bench_dump(tmp_path: Path, small_pair: tuple[Path, Path],
                                                    forks: _ForkCounter) -> None:  # fmt: skip
    npu = _write_dump(tmp_path / "bad_npu" / "dump.json", 10, extra=BAD_ENTRIES["requires_grad a string"])
    here = _error_of(lambda: load_dump(npu))
    fds = _open_fds()
    assert str(_error_of(lambda: pair_reader.load_dump_pair(npu, small_pair[1]))) == str(here)
    assert forks.calls == 1 and _open_fds() == fds


# ----------------------------------------------------------------------------------------------------------
# a child that fails otherwise


def _die(code: int) -> Any:
    def payload(path: Path) -> bytes:
        os._exit(code)

    return payload


def _send_nothing(fd: int, data: bytes) -> None:
    os.close(fd)


@pytest.mark.parametrize(
    ("patch", "replacement", "said"),
    [
        ("_child_payload", lambda path: marshal.dumps((2, "boom")), "boom"),
        ("_child_payload", lambda path: marshal.dumps((2, "MemoryError: out of memory")), "MemoryError"),
        ("_child_payload", _die(3), "no answer"),  # the child dies before answering
        ("_send", _send_nothing, "no answer"),  # the child closes the pipe without a word
    ],
)
def test_a_failing_forked_child_falls_back_to_reading_here(
    small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    forks: _ForkCounter, patch: str, replacement: Any, said: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(pair_reader, patch, replacement)
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        npu, bench = pair_reader.load_dump_pair(*small_pair, parallel=True)
    assert forks.calls == 1
    assert_same_dump(npu, load_dump(small_pair[0]))
    assert_same_dump(bench, load_dump(small_pair[1]))
    warnings = [r for r in caplog.records if r.name == pair_reader.__name__ and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert said in warnings[0].getMessage() and str(small_pair[1]) in warnings[0].getMessage()


def test_a_successful_child_logs_no_warning(small_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
                                            forks: _ForkCounter) -> None:  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        pair_reader.load_dump_pair(*small_pair, parallel=True)
    assert forks.calls == 1
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def _send_half_and_die(fd: int, data: bytes) -> None:
    view = memoryview(data)[: len(data) // 2]
    while view:
        view = view[os.write(fd, view) :]
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would, halfway through the answer


_SPAWNED_HALF_ANSWER = (
    "import os, sys\n"
    "from pathlib import Path\n"
    "from parity.shared.dump.pair_reader import _child_payload\n"
    "data = _child_payload(Path(sys.argv[1]))\n"
    "sys.stdout.buffer.write(data[: len(data) // 2])\n"
    "sys.stdout.flush()\n"
    "os.kill(os.getpid(), 9)\n"
)


@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_a_child_killed_halfway_through_its_answer_falls_back(
    small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "fork":
        monkeypatch.setattr(pair_reader, "_send", _send_half_and_die)
        _npu, bench = pair_reader.load_dump_pair(*small_pair, parallel=True)
    else:
        monkeypatch.setattr(pair_reader, "_SPAWNED_CHILD", _SPAWNED_HALF_ANSWER)
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            _npu, bench = pair_reader.load_dump_pair(*small_pair, parallel=True)
        finally:
            stop.set()
            thread.join()
    assert_same_dump(bench, load_dump(small_pair[1]))


def test_a_fork_that_cannot_start_falls_back(small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
                                             ) -> None:  # fmt: skip
    def fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(pair_reader.os, "fork", fork)
    real_pipe = pair_reader.os.pipe
    pipes: list[int] = []

    def pipe() -> tuple[int, int]:
        ends = real_pipe()
        pipes.extend(ends)
        return ends

    monkeypatch.setattr(pair_reader.os, "pipe", pipe)
    try:
        _npu, bench = pair_reader.load_dump_pair(*small_pair, parallel=True)
    finally:
        leaked = 0
        for fd in pipes:  # close what the code left open, so the test process does not keep it
            try:
                os.close(fd)
                leaked += 1
            except OSError:
                pass
    assert leaked == 0
    assert_same_dump(bench, load_dump(small_pair[1]))
