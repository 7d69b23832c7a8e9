"""Reading both dumps at once (``pair_reader``) and the columns' wire form it ships them in.

The read in a child (forked, or a fresh interpreter when other threads run) must give exactly what a read in
this process gives, raise the same error for a bad dump, fall back to reading here when the child fails, and
be taken only when asked for and when the files are big enough.
"""

from __future__ import annotations

import json
import logging
import marshal
import math
import threading
from pathlib import Path
from typing import Any

import pytest
from parity.shared.dump import pair_reader
from parity.shared.dump.columns import DumpColumns
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.errors import DumpError


def _columns_state(cols: DumpColumns) -> dict[str, Any]:
    return {
        "entry_names": cols.entry_names, "names": cols.names, "apis": cols.apis,
        "entry_of": list(cols.entry_of), "states": cols.states, "dtypes": cols.dtypes, "shapes": cols.shapes,
        "requires_grads": cols.requires_grads, "stats": cols.stats.tobytes(), "plain": bytes(cols.plain),
        "odd": repr(cols.odd), "md5s": cols.md5s, "data_names": cols.data_names,
        "is_tensor": bytes(cols.is_tensor), "p2p": cols.p2p,
    }  # fmt: skip


def _state(dump: Dump) -> dict[str, Any]:
    header = {"path": dump.path, "task": dump.task, "level": dump.level, "framework": dump.framework,
              "dump_data_dir": dump.dump_data_dir, "has_md5": dump.has_md5}  # fmt: skip
    return header | _columns_state(dump.columns)


def _leaf(i: int) -> dict[str, Any]:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [i % 5, 3], "Max": i * 0.5,
            "Min": -1.0 * i, "Mean": 0.25, "Norm": float(i), "requires_grad": i % 2 == 0}  # fmt: skip


def _write(path: Path, n_entries: int, **extra: Any) -> Path:
    data: dict[str, Any] = {}
    for i in range(n_entries):
        output = _leaf(i + 1) | {"Max": None if i % 7 == 0 else 1.5}
        data[f"Torch.add.{i}.forward"] = {"input_args": [_leaf(i), {"type": "int", "value": i % 3}, None],
                                          "input_kwargs": {"alpha": {"type": "float", "value": 0.5}},
                                          "output": [output]}  # fmt: skip
    p2p = {"class_type": "torch.distributed.P2POp", "op": "isend", "peer": 1, "tag": 0, "tensor": _leaf(3)}
    data["Distributed.isend.0.forward"] = {"input_args": [p2p]}
    data.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    return path


@pytest.fixture
def big_pair(tmp_path: Path) -> tuple[Path, Path]:
    npu = _write(tmp_path / "npu" / "dump.json", 6000)
    bench = _write(tmp_path / "bench" / "dump.json", 6100)
    assert npu.stat().st_size + bench.stat().st_size >= pair_reader.MIN_PARALLEL_BYTES
    return npu, bench


class _ForkCounter:
    """Wraps os.fork; counts the forks this process made (the child never returns to the test)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = pair_reader.os.fork

        def fork() -> int:
            pid = real()
            if pid != 0:
                self.calls += 1
            return pid

        monkeypatch.setattr(pair_reader.os, "fork", fork)


def test_the_forked_read_equals_the_read_here(big_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
                                              ) -> None:  # fmt: skip
    forks = _ForkCounter(monkeypatch)
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=True)
    assert forks.calls == 1
    assert _state(npu) == _state(load_dump(big_pair[0]))
    assert _state(bench) == _state(load_dump(big_pair[1]))
    assert bench.columns.p2p and bench.columns.odd  # the sparse columns made the trip too


class _SpawnCounter:
    """Wraps subprocess.Popen as pair_reader sees it; counts the reader processes started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = pair_reader.subprocess.Popen

        def popen(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(pair_reader.subprocess, "Popen", popen)


class _OtherThread:
    """A second thread alive for the duration of a ``with`` block: forking is then off limits."""

    def __enter__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.stop.wait)
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_no_child_when_not_asked_or_when_small(
    big_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forks, spawns = _ForkCounter(monkeypatch), _SpawnCounter(monkeypatch)
    npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=False)
    small = (_write(tmp_path / "s" / "npu.json", 3), _write(tmp_path / "s" / "bench.json", 3))
    pair_reader.load_dump_pair(*small, parallel=True)
    assert (forks.calls, spawns.calls) == (0, 0)
    assert _state(bench) == _state(load_dump(big_pair[1]))


def test_with_another_thread_a_fresh_interpreter_reads_instead_of_a_fork(
    big_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    forks, spawns = _ForkCounter(monkeypatch), _SpawnCounter(monkeypatch)
    with _OtherThread():
        npu, bench = pair_reader.load_dump_pair(*big_pair, parallel=True)
    assert (forks.calls, spawns.calls) == (0, 1)
    assert _state(npu) == _state(load_dump(big_pair[0]))
    assert _state(bench) == _state(load_dump(big_pair[1]))


def test_a_spawned_reader_that_cannot_run_falls_back_to_reading_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(pair_reader, "_SPAWNED_CHILD", "import sys\nsys.exit('no parity here')\n")
    npu = _write(tmp_path / "npu" / "dump.json", 5)
    bench = _write(tmp_path / "bench" / "dump.json", 6)
    with _OtherThread(), caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        _npu, got = pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert _state(got) == _state(load_dump(bench))
    assert "no parity here" in caplog.text


@pytest.mark.parametrize(
    "bad",
    [
        {"Torch.bad.0.forward": {"input_args": [_leaf(1) | {"requires_grad": "yes"}]}},
        {"Torch.bad.0.forward": {"output": 7}},
        {"Torch.bad.0.forward": {"input_args": [_leaf(1) | {"Max": [1]}]}},
    ],
)
def test_a_bad_bench_dump_read_by_the_child_raises_the_same_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: dict[str, Any]
) -> None:
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    forks = _ForkCounter(monkeypatch)
    npu = _write(tmp_path / "npu" / "dump.json", 5)
    bench = _write(tmp_path / "bench" / "dump.json", 5, **bad)
    with pytest.raises(DumpError) as here:
        load_dump(bench)
    with pytest.raises(DumpError) as forked:
        pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert forks.calls == 1
    with _OtherThread(), pytest.raises(DumpError) as spawned:
        pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert str(forked.value) == str(spawned.value) == str(here.value)
    assert "Torch.bad.0.forward" in str(here.value)


def test_malformed_json_in_the_child_keeps_line_and_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:  # fmt: skip
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    npu = _write(tmp_path / "npu" / "dump.json", 5)
    bench = tmp_path / "bench" / "dump.json"
    bench.parent.mkdir()
    bench.write_text('{"task": "statistics",\n "data": {"x": }}')
    with pytest.raises(DumpError, match=r"line 2 column"):
        pair_reader.load_dump_pair(npu, bench, parallel=True)


def test_a_failing_child_falls_back_to_reading_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(pair_reader, "_child_payload", lambda path: marshal.dumps((2, "MemoryError: boom")))
    npu = _write(tmp_path / "npu" / "dump.json", 5)
    bench = _write(tmp_path / "bench" / "dump.json", 6)
    with caplog.at_level(logging.WARNING, logger=pair_reader.__name__):
        _npu, got = pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert _state(got) == _state(load_dump(bench))
    assert "MemoryError: boom" in caplog.text


def test_a_bad_npu_dump_raises_and_leaves_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pair_reader, "MIN_PARALLEL_BYTES", 0)
    reaped: list[int] = []
    real_waitpid = pair_reader.os.waitpid

    def waitpid(pid: int, flags: int) -> tuple[int, int]:
        reaped.append(pid)
        return real_waitpid(pid, flags)

    monkeypatch.setattr(pair_reader.os, "waitpid", waitpid)
    npu = _write(tmp_path / "npu" / "dump.json", 5, **{"Torch.bad.0.forward": []})
    bench = _write(tmp_path / "bench" / "dump.json", 5)
    with pytest.raises(DumpError, match="must be an object"):
        pair_reader.load_dump_pair(npu, bench, parallel=True)
    assert len(reaped) == 1


def test_columns_wire_form_round_trips_through_marshal(tmp_path: Path) -> None:
    odd = {"Torch.odd.0.forward": {"input_args": [
        _leaf(1) | {"Max": 2**70, "Min": None, "Mean": True, "Norm": "x"},
        _leaf(2) | {"Max": math.nan, "Min": math.inf, "Mean": -math.inf, "Norm": -0.0},
        _leaf(3) | {"md5": "0a0b0c0d", "data_name": "Torch.odd.0.forward.input.2.pt"},
    ]}}  # fmt: skip
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "data": odd}, allow_nan=True))
    cols = load_dump(path).columns
    back = DumpColumns.from_wire(marshal.loads(marshal.dumps(cols.to_wire())))
    assert _columns_state(back) == _columns_state(cols)
    assert back.stats_of(0) == (2**70, None, True, "x")
    mx, mn, mean, norm = back.stats_of(1)
    assert math.isnan(mx) and (mn, mean) == (math.inf, -math.inf) and math.copysign(1, norm) == -1
    assert back.leaf(2).md5 == "0a0b0c0d"
