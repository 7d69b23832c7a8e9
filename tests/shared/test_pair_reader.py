"""``load_dump_pair``: the bench dump the kept reader process reads must be the dump ``load_dump`` reads here.

Checked field by field on a pair of dumps above ``MIN_PARALLEL_BYTES``. The reader is started only when asked
for and when the files are big enough, then kept: one process answers call after call until ``close_reader``,
its idle timeout, or its death, after which the next call starts another. A reader that dies before or while
answering, or cannot start, makes the bench dump be read here (with one warning) and the result stays right;
a bad bench dump raises the very ``DumpError`` a read here raises and leaves the reader running; a bad NPU
dump kills the reader whose answer nobody will read, without leaking a descriptor. Two threads at once both
get the right dumps, and a forked child starts its own reader instead of talking to its parent's. Any path
makes the trip whole, and a relative one is read from the caller's directory, not the reader's.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
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


@pytest.fixture(scope="module")
def big_want(big_pair: tuple[Path, Path]) -> tuple[Dump, Dump]:
    """``load_dump`` of both big dumps, read here once for the whole module."""
    return load_dump(big_pair[0]), load_dump(big_pair[1])


@pytest.fixture
def small_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two small dumps, with the size threshold lowered so that they take the reader's path."""
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


def _assert_pair(got: tuple[Dump, Dump], paths: tuple[Path, Path]) -> None:
    assert_same_dump(got[0], load_dump(paths[0]))
    assert_same_dump(got[1], load_dump(paths[1]))


# ----------------------------------------------------------------------------------------------------------
# the reader process, as the tests see it


@pytest.fixture(autouse=True)
def no_reader_left() -> Iterator[None]:
    """Every test starts without a reader and leaves none behind."""
    pair_reader.close_reader()
    yield
    pair_reader.close_reader()


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
def spawns(monkeypatch: pytest.MonkeyPatch) -> _SpawnCounter:
    return _SpawnCounter(monkeypatch)


def _reader() -> Any:
    """The reader this process keeps now; fails when there is none."""
    reader = pair_reader._current
    assert reader is not None, "no reader process is kept"
    return reader


def _reader_pid() -> int:
    pid: int = _reader().proc.pid
    return pid


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _error_of(read: Callable[[], Any]) -> DumpError:
    with pytest.raises(DumpError) as caught:
        read()
    return caught.value


# ----------------------------------------------------------------------------------------------------------
# the same dumps, whichever way they are read


def test_the_reader_read_of_big_dumps_equals_the_serial_read(big_pair: tuple[Path, Path],
                                                             big_want: tuple[Dump, Dump],
                                                             spawns: _SpawnCounter) -> None:  # fmt: skip
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=True)
    assert spawns.calls == 1 and _reader().alive()
    serial_npu, serial_bench = pair_reader.load_dump_pair(*big_pair, parallel=False)
    assert spawns.calls == 1
    assert_same_dump(npu, serial_npu)
    assert_same_dump(bench, serial_bench)
    assert_same_dump(npu, big_want[0])
    assert_same_dump(bench, big_want[1])
    # The bench dump really holds every kind of column content that has to make the trip.
    cols = bench.columns
    assert len(cols) > 30_000 and cols.p2p and bench.has_md5
    odd_values = {type(x) for stats in cols.odd.values() for x in stats}
    assert {int, bool, str, type(None), float} <= odd_values
    assert any(math.isnan(x) for x in cols.stats) and math.inf in cols.stats
    assert len(cols.entry_names) > len(set(cols.apis))  # entries without leaves


def test_a_successful_read_logs_no_warning(small_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
                                           spawns: _SpawnCounter) -> None:  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair, parallel=True)
    assert spawns.calls == 1
    assert _warnings(caplog) == []
    _assert_pair(got, small_pair)


# ----------------------------------------------------------------------------------------------------------
# when a reader is started


def test_no_reader_when_not_asked(big_pair: tuple[Path, Path], big_want: tuple[Dump, Dump],
                                  spawns: _SpawnCounter) -> None:  # fmt: skip
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=False)
    assert spawns.calls == 0 and pair_reader._current is None
    assert_same_dump(npu, big_want[0])
    assert_same_dump(bench, big_want[1])


def test_the_size_threshold_counts_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawns: _SpawnCounter
) -> None:
    npu = _write_dump(tmp_path / "npu" / "dump.json", 30)
    bench = _write_dump(tmp_path / "bench" / "dump.json", 20)
    total = npu.stat().st_size + bench.stat().st_size
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", total + 1)
    _assert_pair(pair_reader.load_dump_pair(npu, bench, parallel=True), (npu, bench))
    assert spawns.calls == 0 and pair_reader._current is None
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", total)
    _assert_pair(pair_reader.load_dump_pair(npu, bench, parallel=True), (npu, bench))
    assert spawns.calls == 1 and _reader().alive()


def test_the_real_threshold_keeps_small_dumps_here(tmp_path: Path, spawns: _SpawnCounter) -> None:
    assert pair_reader.MIN_PARALLEL_BYTES == 2 << 20
    npu = _write_dump(tmp_path / "npu" / "dump.json", 300)
    bench = _write_dump(tmp_path / "bench" / "dump.json", 300)
    _assert_pair(pair_reader.load_dump_pair(npu, bench, parallel=True), (npu, bench))
    assert spawns.calls == 0 and pair_reader._current is None


def test_start_reader_starts_one_only_when_none_runs(small_pair: tuple[Path, Path],
                                                     spawns: _SpawnCounter) -> None:  # fmt: skip
    pair_reader.start_reader()
    assert spawns.calls == 1 and _reader().alive()
    pid = _reader_pid()
    pair_reader.start_reader()
    assert spawns.calls == 1 and _reader_pid() == pid
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    assert spawns.calls == 1 and _reader_pid() == pid  # the compare used the reader started beforehand


# ----------------------------------------------------------------------------------------------------------
# the reader is kept, and replaced when it is gone


def test_the_reader_is_kept_until_close_reader(small_pair: tuple[Path, Path], spawns: _SpawnCounter) -> None:
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    first = _reader()
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    assert _reader() is first and spawns.calls == 1
    pair_reader.close_reader()
    assert pair_reader._current is None
    assert first.proc.returncode == 0  # it left by itself once its input closed, and was reaped
    assert first.proc.stdin.closed and first.proc.stdout.closed
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    assert spawns.calls == 2 and _reader_pid() != first.proc.pid


def test_a_reader_killed_between_calls_is_replaced_without_a_warning(
    small_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture, spawns: _SpawnCounter
) -> None:
    pair_reader.load_dump_pair(*small_pair)
    old = _reader()
    os.kill(old.proc.pid, signal.SIGKILL)
    assert old.proc.wait(timeout=5) == -signal.SIGKILL
    assert not old.alive()
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    assert _warnings(caplog) == []  # replaced before the request, not after a failed one
    assert spawns.calls == 2 and _reader() is not old and _reader().alive()
    assert old.proc.stdin.closed and old.proc.stdout.closed
    _assert_pair(got, small_pair)


def test_a_reader_that_left_just_before_the_request_is_replaced_once(
    small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    spawns: _SpawnCounter,
) -> None:  # fmt: skip
    pair_reader.start_reader()
    old = _reader()
    old.proc.kill()
    old.proc.wait(timeout=5)
    monkeypatch.setattr(old, "alive", lambda: True)  # as if its idle time ran out after the check
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    assert _warnings(caplog) == []  # the broken pipe was met with a new reader, not a read here
    assert spawns.calls == 2 and _reader() is not old and _reader().alive()
    assert old.proc.stdin.closed and old.proc.stdout.closed
    _assert_pair(got, small_pair)


def test_an_idle_reader_leaves_by_itself(small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    monkeypatch.setattr(pair_reader, "IDLE_EXIT_S", 0.3)
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    idle = _reader()
    assert idle.proc.poll() is None
    deadline = time.monotonic() + 5
    while idle.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle.proc.returncode == 0, "the idle reader did not leave within 5 s"
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    assert _warnings(caplog) == []
    assert _reader() is not idle and _reader().alive()
    _assert_pair(got, small_pair)


# ----------------------------------------------------------------------------------------------------------
# a reader that fails otherwise than on a bad dump: the bench dump is read here


def _dying_loop(cut: str, end: str = "os._exit(0)") -> str:
    """A reader that answers its first request with the first ``cut`` bytes of the right answer, then ends."""
    return (
        "import os, signal, sys\n"
        "from parity.shared.dump.pair_reader import _LENGTH, _answer_to\n"
        "head = sys.stdin.buffer.read(_LENGTH.size)\n"
        "payload = _answer_to(sys.stdin.buffer.read(_LENGTH.unpack(head)[0]))\n"
        "answer = _LENGTH.pack(len(payload)) + payload\n"
        f"sys.stdout.buffer.write(answer[:{cut}])\n"
        "sys.stdout.buffer.flush()\n"
        f"{end}\n"
    )


@pytest.mark.parametrize(
    "loop",
    [
        pytest.param(_dying_loop("0"), id="no answer"),
        pytest.param(_dying_loop("_LENGTH.size"), id="only the length prefix"),
        pytest.param(_dying_loop("_LENGTH.size + len(payload) // 2"), id="half an answer"),
        pytest.param(_dying_loop("_LENGTH.size + len(payload) // 2", "os.kill(os.getpid(), signal.SIGKILL)"),
                     id="killed halfway"),  # fmt: skip
    ],
)
def test_a_reader_that_dies_while_answering_falls_back(
    small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    loop: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(pair_reader, "_READER_LOOP", loop)
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    _assert_pair(got, small_pair)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and str(small_pair[1]) in warnings[0]
    dead = pair_reader._current
    dead_pid = dead.proc.pid if dead is not None else None
    monkeypatch.undo()  # the real reader loop again; the threshold stays lowered for the next call
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    assert _warnings(caplog) == []
    assert _reader().alive() and _reader_pid() != dead_pid
    _assert_pair(got, small_pair)


_FAILING_LOOP = """\
import marshal, sys
from parity.shared.dump.pair_reader import _LENGTH
while len(head := sys.stdin.buffer.read(_LENGTH.size)) == _LENGTH.size:
    sys.stdin.buffer.read(_LENGTH.unpack(head)[0])
    payload = marshal.dumps({answer!r})
    sys.stdout.buffer.write(_LENGTH.pack(len(payload)) + payload)
    sys.stdout.buffer.flush()
"""


@pytest.mark.parametrize(
    ("answer", "said"),
    [((2, "MemoryError: out of memory"), "MemoryError: out of memory"), (5, "wrong shape")],
)
def test_a_reader_that_answers_a_failure_falls_back_and_stays(
    small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    answer: Any, said: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(pair_reader, "_READER_LOOP", _FAILING_LOOP.format(answer=answer))
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    _assert_pair(got, small_pair)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and said in warnings[0] and str(small_pair[1]) in warnings[0]
    assert _reader().alive()  # it answered: nothing to replace


def test_a_reader_that_cannot_start_falls_back(small_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    def popen(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(pair_reader.subprocess, "Popen", popen)
    fds = _open_fds()
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        got = pair_reader.load_dump_pair(*small_pair)
    _assert_pair(got, small_pair)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and str(small_pair[1]) in warnings[0]
    assert "Resource temporarily unavailable" in warnings[0]
    assert pair_reader._current is None and _open_fds() == fds
    monkeypatch.undo()
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    assert _reader().alive()  # processes can be had again: the next call has a reader


# ----------------------------------------------------------------------------------------------------------
# a bad dump


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
    path = tmp_path / "bad_bench" / "dump.json"
    if case in BAD_ENTRIES:
        return _write_dump(path, 20, extra=BAD_ENTRIES[case])
    path.parent.mkdir(parents=True, exist_ok=True)
    if case == "a directory":
        path.mkdir()
        return path
    text = BAD_TEXTS[case]
    if text is None:
        path.write_bytes(b'{"task": "statistics", "data": {"caf\xe9": {}}}')
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("case", [*BAD_TEXTS, *BAD_ENTRIES, "a directory"])
def test_a_bad_bench_dump_read_by_the_reader_raises_the_same_error(
    tmp_path: Path, small_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture, case: str
) -> None:
    npu = small_pair[0]
    bench = _bad_bench(tmp_path, case)
    here = _error_of(lambda: load_dump(bench))
    if case == "broken JSON":
        assert here.where is not None and "line 2 column" in here.where
    pair_reader.start_reader()
    pid = _reader_pid()
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        there = _error_of(lambda: pair_reader.load_dump_pair(npu, bench, parallel=True))
    assert _warnings(caplog) == []  # the reader read it: no fallback
    assert type(there) is type(here)
    assert str(there) == str(here)
    assert (there.file, there.problem, there.where) == (here.file, here.problem, here.where)
    assert _reader_pid() == pid and _reader().alive()  # a bad dump is no reason to replace the reader
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    assert _reader_pid() == pid


@pytest.mark.parametrize("through_the_reader", [False, True])
def test_a_missing_bench_dump_raises_the_same_error(
    small_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, through_the_reader: bool,
) -> None:  # fmt: skip
    missing = tmp_path / "nowhere" / "dump.json"
    here = _error_of(lambda: load_dump(missing))
    if through_the_reader:  # a file missing at the size check is read here; one gone just after is not
        monkeypatch.setattr(pair_reader, "_big_enough", lambda npu, bench: True)
        pair_reader.start_reader()
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        there = _error_of(lambda: pair_reader.load_dump_pair(small_pair[0], missing))
    assert str(there) == str(here) and there.where == here.where
    assert _warnings(caplog) == []
    if through_the_reader:
        assert _reader().alive()
    else:
        assert pair_reader._current is None


def test_a_bad_npu_dump_wins_over_a_good_bench_dump(tmp_path: Path, big_pair: tuple[Path, Path],
                                                    big_want: tuple[Dump, Dump]) -> None:  # fmt: skip
    npu = _write_dump(tmp_path / "bad_npu" / "dump.json", 10, extra=BAD_ENTRIES["requires_grad a string"])
    bench = big_pair[1]  # big: the reader is still reading it when the NPU dump fails here
    here = _error_of(lambda: load_dump(npu))
    pair_reader.start_reader()
    fds = _open_fds()  # with the reader's two pipe ends
    for _ in range(3):
        reader = _reader() if pair_reader._current is not None else None
        there = _error_of(lambda: pair_reader.load_dump_pair(npu, bench))
        assert str(there) == str(here)
        assert pair_reader._current is None  # its answer is not wanted: killed, started afresh next time
        if reader is not None:
            assert reader.proc.returncode == -signal.SIGKILL
        assert _open_fds() == fds - 2
    got = pair_reader.load_dump_pair(*big_pair)
    assert _reader().alive()
    assert_same_dump(got[0], big_want[0])
    assert_same_dump(got[1], big_want[1])
    assert _open_fds() == fds


# ----------------------------------------------------------------------------------------------------------
# threads and forks


def test_two_threads_at_once_both_get_the_right_dumps(big_pair: tuple[Path, Path],
                                                      big_want: tuple[Dump, Dump]) -> None:  # fmt: skip
    for _round in range(2):
        start = threading.Barrier(2)
        results: dict[int, tuple[Dump, Dump] | BaseException] = {}

        def compare(n: int, results: dict[int, Any] = results, start: threading.Barrier = start) -> None:
            try:
                start.wait(timeout=10)
                results[n] = pair_reader.load_dump_pair(*big_pair)
            except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
                results[n] = exc

        threads = [threading.Thread(target=compare, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(results) == [0, 1]
        for got in results.values():
            assert isinstance(got, tuple), got
            assert_same_dump(got[0], big_want[0])
            assert_same_dump(got[1], big_want[1])
    assert not pair_reader._lock.locked()
    pid = _reader_pid()  # at least one of them used the reader; it is still in step
    got = pair_reader.load_dump_pair(*big_pair)
    assert _reader_pid() == pid
    assert_same_dump(got[1], big_want[1])


def _in_a_child(check: Callable[[], str], timeout_s: float = 30) -> str:
    """``check()`` run in a forked child; its answer, or a failure here for whatever went wrong there."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            try:
                report, code = check(), 0
            except BaseException:  # noqa: BLE001 - sent to the parent, which fails the test
                report = traceback.format_exc()
            data = report.encode()
            while data:
                data = data[os.write(write_end, data) :]
        finally:
            os._exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    report = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked child failed:\n{report}"
    return report


def test_a_forked_child_starts_its_own_reader(big_pair: tuple[Path, Path],
                                              big_want: tuple[Dump, Dump]) -> None:  # fmt: skip
    pair_reader.load_dump_pair(*big_pair)
    parents = _reader()

    def in_the_child() -> str:
        assert pair_reader._current is None  # forgotten at the fork
        assert parents in pair_reader._inherited
        assert not parents.alive()  # not ours to use
        assert not pair_reader._lock.locked()  # the parent's held lock is not inherited
        npu, bench = pair_reader.load_dump_pair(*big_pair)
        assert_same_dump(npu, big_want[0])
        assert_same_dump(bench, big_want[1])
        mine = _reader()
        assert mine is not parents and mine.owner == os.getpid() and mine.alive()
        assert mine.proc.pid != parents.proc.pid
        parents.close(kill=True)  # a no-op in the child: the parent's reader is the parent's to close
        pair_reader.close_reader()
        assert mine.proc.returncode == 0
        return str(mine.proc.pid)

    with pair_reader._lock:  # as if another thread of the parent were in a compare when it forks
        childs_reader = int(_in_a_child(in_the_child))
    assert childs_reader != parents.proc.pid
    assert pair_reader._current is parents and parents.alive()
    got = pair_reader.load_dump_pair(*big_pair)
    assert _reader() is parents  # still in step: the child neither used nor closed it
    assert_same_dump(got[0], big_want[0])
    assert_same_dump(got[1], big_want[1])


def test_a_failure_in_the_forked_child_fails_the_test() -> None:
    def in_the_child() -> str:
        raise AssertionError("wrong in the child")

    with pytest.raises(AssertionError, match="wrong in the child"):
        _in_a_child(in_the_child)


# ----------------------------------------------------------------------------------------------------------
# any path makes the trip: requests are framed, and carry the directory a relative path is relative to


@pytest.mark.parametrize("name", ["odd\nname", "caf\udce9", "sp ace"])
def test_an_odd_bench_path_reaches_the_reader_whole(
    tmp_path: Path, small_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture, name: str
) -> None:
    try:
        bench = _write_dump(tmp_path / name / "dump.json", 45, salt=4)
    except (UnicodeEncodeError, OSError):
        pytest.skip(f"this file system takes no {name!r}")
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        _assert_pair(pair_reader.load_dump_pair(small_pair[0], bench), (small_pair[0], bench))
        pid = _reader_pid()
        _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)  # the reader is still in step
    assert _warnings(caplog) == [] and _reader_pid() == pid


def test_relative_paths_after_a_change_of_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    first, second = tmp_path / "first", tmp_path / "second"
    for root, n in ((first, 10), (second, 20)):
        _write_dump(root / "npu" / "dump.json", n, salt=n)
        _write_dump(root / "bench" / "dump.json", n, salt=n + 1)
    monkeypatch.chdir(first)
    pair_reader.start_reader()
    monkeypatch.chdir(second)
    relative = (Path("npu") / "dump.json", Path("bench") / "dump.json")
    got = pair_reader.load_dump_pair(*relative)
    _assert_pair(got, relative)
    assert len(got[1].columns) == len(load_dump(second / "bench" / "dump.json").columns)
    assert got[1].path == relative[1]  # named as the caller named it, in errors too
    missing = Path("gone") / "dump.json"
    there = _error_of(lambda: pair_reader.load_dump_pair(relative[0], missing))
    assert str(there) == str(_error_of(lambda: load_dump(missing))) and str(missing) in str(there)


def test_a_vanished_working_directory_reads_here(tmp_path: Path, small_pair: tuple[Path, Path],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.setattr(pair_reader, "_big_enough", lambda npu, bench: True)  # the size check would miss it
    pair_reader.start_reader()
    monkeypatch.chdir(gone)
    gone.rmdir()
    relative = Path("bench") / "dump.json"
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        there = _error_of(lambda: pair_reader.load_dump_pair(small_pair[0], relative))
    assert str(there) == str(_error_of(lambda: load_dump(relative)))
    assert len(_warnings(caplog)) == 1 and str(relative) in _warnings(caplog)[0]
    monkeypatch.chdir(tmp_path)
    _assert_pair(pair_reader.load_dump_pair(*small_pair), small_pair)
    assert _reader().alive()
