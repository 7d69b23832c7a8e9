"""With ``async_dump: true`` the files are written on the background writer thread: complete, in order,
never half a step (with ``async_dump`` false, ``step()`` waits for the same thread: test_durable_steps.py).

Each test holds the writer thread on an event, so what training did meanwhile is deterministic: the thread
cannot have run a job before the event is set, and runs the queued jobs in order after it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.client.tensor_writer import BackgroundWriter

from tests.client.conftest import dump_once, load_data, model_and_input, train_step


def _async(tmp: Path) -> str:
    """A config.json with ``async_dump: true``: stop() and step() return without waiting for the writer."""
    cfg = tmp / "async_config.json"
    cfg.write_text(json.dumps({"async_dump": True}))
    return str(cfg)


def _writer() -> BackgroundWriter:
    inst = PrecisionDebugger._instance
    assert inst is not None and inst._writer is not None, "the writer starts with the first start()"
    return inst._writer


@pytest.fixture
def hold() -> Iterator[threading.Event]:
    """Set the event to let the writer thread go on; always set at the end so no test can hang."""
    release = threading.Event()
    yield release
    release.set()


def _hold_writer(release: threading.Event) -> None:
    _writer().submit_call(lambda: release.wait(30))


def _read_on_writer(rank_dir: Path, into: list[dict[str, Any]]) -> None:
    """Queue a read of dump.json: it runs after every write queued before it, before any queued after."""
    _writer().submit_call(lambda: into.append(json.loads((rank_dir / "dump.json").read_text())["data"]))


def test_step_files_are_complete_once_drained(tmp_path: Path, hold: threading.Event) -> None:
    PrecisionDebugger(_async(tmp_path), dump_path=str(tmp_path), level="mix")
    model, x = model_and_input("mlp")
    PrecisionDebugger.start(model)
    _hold_writer(hold)
    train_step(model, x)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()  # returns while the writer is held: nothing can be on disk yet
    assert not (tmp_path / "step0/rank0/dump.json").exists()
    hold.set()
    data = load_data(tmp_path)  # drains
    rank_dir = tmp_path / "step0/rank0"
    assert sorted(p.name for p in rank_dir.iterdir()) == ["construct.json", "dump.json", "stack.json"]
    assert "Module.fc1.Linear.forward.0" in data and "Module.fc1.Linear.backward.0" in data
    leaf = data["Functional.linear.0.forward"]["output"][0]
    assert isinstance(leaf["Max"], float) and isinstance(leaf["Norm"], float)
    construct = json.loads((rank_dir / "construct.json").read_text())
    assert construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    stack = json.loads((rank_dir / "stack.json").read_text())
    assert any("Functional.linear.0.forward" in names for names, _ in stack.values())


def test_stop_hands_off_a_snapshot_later_recording_cannot_change(
    tmp_path: Path, hold: threading.Event
) -> None:
    PrecisionDebugger(_async(tmp_path), dump_path=str(tmp_path), level="L0")
    model, x = model_and_input("mlp")
    PrecisionDebugger.start(model)
    _hold_writer(hold)
    out = model(x)
    PrecisionDebugger.stop()  # the snapshot: forward entries only
    (out**2).mean().backward()  # module backward hooks still record after stop (§1.3) ...
    PrecisionDebugger.start(model)
    model(x)  # ... and so does a second start in the same step
    at_stop: list[dict[str, Any]] = []
    _read_on_writer(tmp_path / "step0/rank0", at_stop)
    PrecisionDebugger.step()
    hold.set()
    final = load_data(tmp_path)
    assert "Module.fc1.Linear.forward.0" in at_stop[0]
    assert not any(".backward." in name or "forward.1" in name for name in at_stop[0])
    assert {"Module.fc1.Linear.backward.0", "Module.fc1.Linear.forward.1"} <= set(final)


def test_backward_after_the_step_does_not_touch_the_handed_off_step(
    tmp_path: Path, hold: threading.Event
) -> None:
    PrecisionDebugger(_async(tmp_path), dump_path=str(tmp_path), level="L1")
    x = torch.randn(3, requires_grad=True)
    PrecisionDebugger.start()
    _hold_writer(hold)
    y = torch.sin(x).sum()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()  # the live containers are queued now; the writer has not read them yet
    y.backward()  # the API backward hook of step 0 fires into the recorder's fresh containers
    hold.set()
    data = load_data(tmp_path)
    assert "Torch.sin.0.forward" in data and "Torch.sin.0.backward" not in data


class RecordingUploader:
    instances: list[RecordingUploader] = []

    def __init__(self, server: str, **kwargs: Any) -> None:
        self.calls: list[tuple[int, list[str], str]] = []
        RecordingUploader.instances.append(self)

    def submit_rank_dir(self, step: int, rank: int, rank_dir: Path) -> None:
        # what a real uploader would read right now: it must be the step's whole, final dump.json
        names = list(json.loads((rank_dir / "dump.json").read_text())["data"])
        self.calls.append((step, names, threading.current_thread().name))

    def close(self, timeout: float | None = None) -> None:
        pass


def test_uploader_gets_each_step_only_after_its_files_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold: threading.Event
) -> None:
    import parity.client.uploader as uploader

    RecordingUploader.instances = []
    monkeypatch.setattr(uploader, "BackgroundUploader", RecordingUploader)
    PrecisionDebugger(_async(tmp_path), dump_path=str(tmp_path), level="L1", server="http://parity:8000")
    x = torch.randn(3, requires_grad=True)
    PrecisionDebugger.start()
    _hold_writer(hold)
    y = torch.sin(x).sum()
    PrecisionDebugger.stop()  # step 0 partly written here ...
    y.backward()
    PrecisionDebugger.step()  # ... and completely (with its backward) here
    (up,) = RecordingUploader.instances  # made at construction, to check the server before training
    assert not up.calls, "nothing is handed on before the writer ran"
    hold.set()
    PrecisionDebugger.start()
    torch.exp(x)
    PrecisionDebugger.step()
    PrecisionDebugger.drain()
    assert [(step, names) for step, names, _ in up.calls] == [  # step 0 whole, in call order
        (0, ["Torch.sin.0.forward", "Tensor.sum.0.forward", "Tensor.sum.0.backward", "Torch.sin.0.backward"]),
        (1, ["Torch.exp.0.forward"]),
    ]
    assert {thread for _, _, thread in up.calls} == {"parity-writer"}


def test_write_errors_are_logged_once_and_never_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import parity.client.uploader as uploader

    RecordingUploader.instances = []
    monkeypatch.setattr(uploader, "BackgroundUploader", RecordingUploader)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the dump directory should go")
    PrecisionDebugger(dump_path=str(blocker), level="L1", server="http://parity:8000")
    with caplog.at_level(logging.DEBUG, logger="parity.client.tensor_writer"):
        for _ in range(3):
            PrecisionDebugger.start()
            torch.exp(torch.ones(2))
            PrecisionDebugger.stop()
            PrecisionDebugger.step()  # must not raise
        PrecisionDebugger.drain()
    failures = [r for r in caplog.records if "background write failed" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING] + [logging.DEBUG] * (len(failures) - 1)
    assert len(failures) == 3 and "not-a-directory" in failures[0].getMessage()
    assert _writer().errors == 3
    assert not any(up.calls for up in RecordingUploader.instances), "an unwritten directory is never uploaded"


def test_a_failing_job_does_not_stop_the_writer(tmp_path: Path) -> None:
    writer = BackgroundWriter(max_queue=4)
    done: list[int] = []
    try:
        writer.submit_call(lambda: 1 / 0)
        writer.submit(tmp_path / "missing-dir" / "t.pt", torch.ones(2))
        writer.submit(tmp_path / "t.pt", torch.arange(3.0))
        writer.submit_call(lambda: done.append(1), document=True)
        writer.drain()
    finally:
        writer.close()
    assert writer.errors == 2 and done == [1]
    saved = torch.load(tmp_path / "t.pt", weights_only=True, map_location="cpu")
    assert torch.equal(saved, torch.arange(3.0))


def test_tensor_files_are_synced_once_before_the_dump_json_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sync of the step's tensor files (``syncfs`` where Linux has it), before its dump.json exists; the
    fallback (an fsync a file and folder) syncs the same files."""
    from parity.client import tensor_writer

    calls: list[tuple[set[str], bool]] = []
    real = tensor_writer.sync_files

    def recording(paths: list[str | Path]) -> None:
        dump_json = Path(paths[0]).parent.parent / "dump.json"
        calls.append(({Path(p).name for p in paths}, dump_json.exists()))
        real(paths)

    monkeypatch.setattr(tensor_writer, "sync_files", recording)
    root = dump_once(tmp_path / "a", "mlp", "L1", config={"task": "tensor"})
    files = {p.name for p in (root / "step0" / "rank0" / "dump_tensor_data").iterdir()}
    assert calls == [(files, False)] and files
    monkeypatch.setattr(tensor_writer, "_SYNCFS", None)
    tensor_writer.sync_files(sorted((root / "step0" / "rank0" / "dump_tensor_data").iterdir()))


def test_batched_files_are_written_before_the_next_job(tmp_path: Path) -> None:
    """CPU copies are queued in batches; any other job still runs after every file submitted before it,
    and each file holds the tensor as it was at submission (a later in-place update does not reach it)."""
    from parity.client.tensor_writer import _BATCH_FILES

    writer = BackgroundWriter()
    seen: list[int] = []
    n = _BATCH_FILES + 3  # one full batch and a partial one
    try:
        t = torch.zeros(4)
        for i in range(n):
            t.fill_(i)
            writer.submit(tmp_path / f"{i}.pt", t)
        writer.submit_call(lambda: seen.append(len(list(tmp_path.glob("*.pt")))), document=True)
        writer.submit(tmp_path / "last.pt", t)
        writer.drain()
        assert (tmp_path / "last.pt").exists()
    finally:
        writer.close()
    assert seen == [n] and writer.errors == 0
    for i in range(n):
        assert torch.equal(torch.load(tmp_path / f"{i}.pt", weights_only=True), torch.full((4,), float(i)))


def test_the_dump_json_is_encoded_while_its_tensor_files_sync_and_renamed_in_only_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync of a step's tensor files runs beside the encoding of its dump.json (written under its
    temporary name meanwhile), and the dump.json takes its name only once the sync has returned."""
    from parity.client import tensor_writer

    entered, release = threading.Event(), threading.Event()
    real = tensor_writer.sync_files

    def held(paths: list[str | Path]) -> None:
        entered.set()
        assert release.wait(30)
        real(paths)

    monkeypatch.setattr(tensor_writer, "sync_files", held)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "tensor", "async_dump": True}))
    PrecisionDebugger(str(cfg), dump_path=str(tmp_path), level="L1")
    model, x = model_and_input("mlp")
    PrecisionDebugger.start(model)
    train_step(model, x)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()  # async: returns at once, the writer goes on
    rank_dir = tmp_path / "step0" / "rank0"
    try:
        assert entered.wait(30)
        for _ in range(3000):  # the writer encodes and writes the temporary while the sync is held
            if (rank_dir / ".dump.json.tmp").exists():
                break
            release.wait(0.01)
        assert (rank_dir / ".dump.json.tmp").exists() and not (rank_dir / "dump.json").exists()
    finally:
        release.set()
    PrecisionDebugger.drain()
    assert (rank_dir / "dump.json").exists() and not (rank_dir / ".dump.json.tmp").exists()
    assert load_data(tmp_path)
    PrecisionDebugger.reset()
