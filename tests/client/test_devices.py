"""Capture on every device present: CPU always, plus each accelerator found (``make test-accelerator``).

The mixed-device rule (statistics of tensors on several devices and dtypes in one flush never fail) is
checked on CPU too: a ``FakeTensorMode`` tensor claims to live on ``cuda:0`` without a GPU, so one flush holds
real CPU statistics beside statistics that live elsewhere, which is what AdamW's CPU ``step`` counters beside
CUDA weights are on a GPU.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from parity.client import PrecisionDebugger, devices
from parity.client.config import load_config
from parity.client.errors import ConfigError
from parity.client.stats import StatsBuffer, quiet
from parity.client.tensor_writer import BackgroundWriter
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.client.conftest import MLP, load_data

DEVICES = [
    pytest.param(d, marks=[] if d == "cpu" else [pytest.mark.accelerator])
    for d in devices.available_devices()
]


def _leaves(value: Any) -> list[dict[str, Any]]:
    """Every tensor leaf in a dump.json value."""
    if isinstance(value, dict):
        if "dtype" in value and "shape" in value:
            return [value]
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return []


# ---------------------------------------------------------------------------------------------- statistics
def test_one_flush_of_several_devices_and_dtypes_never_fails(caplog: pytest.LogCaptureFixture) -> None:
    buf = StatsBuffer(md5=False)
    with FakeTensorMode():
        fake = torch.ones(4, device="cuda")  # no GPU here: a fake tensor that lives on cuda:0
    real = {
        "f32": torch.tensor([1.0, -2.0, 3.0]),
        "bf16": torch.tensor([0.5, 1.5], dtype=torch.bfloat16),
        "i64": torch.arange(5),
        "bool": torch.tensor([True, False]),
        "step": torch.tensor(7.0),  # AdamW's step counter: 0-d, on the host
        "c64": torch.tensor([3 + 4j]),
    }
    with quiet(), caplog.at_level(logging.WARNING, logger="parity.client.stats"):
        leaves = {k: buf.leaf(t) for k, t in real.items()}
        noted = buf.leaf(fake)
        meta = buf.leaf(torch.empty(2, 3, device="meta"))
        buf.resolve()
    assert leaves["f32"]["Max"] == 3.0 and leaves["f32"]["Min"] == -2.0
    assert leaves["f32"]["Norm"] == pytest.approx(math.sqrt(14))
    assert leaves["bf16"]["Mean"] == 1.0
    assert leaves["i64"]["Max"] == 4.0 and leaves["i64"]["Mean"] == 2.0
    assert leaves["bool"]["Max"] is True and leaves["bool"]["Min"] is False
    assert leaves["step"]["Max"] == leaves["step"]["Min"] == leaves["step"]["Mean"] == 7.0
    assert leaves["c64"]["Max"] == 5.0
    for leaf, shape in ((noted, [4]), (meta, [2, 3])):
        assert leaf["shape"] == shape and leaf["dtype"] == "torch.float32"
        assert [leaf[k] for k in ("Max", "Min", "Mean", "Norm")] == [None] * 4
    assert noted["note"].startswith("fake tensor") and meta["note"].startswith("meta tensor")
    assert "note" not in leaves["f32"]
    assert buf.unreadable == 2
    assert buf.pending == 0


@pytest.mark.parametrize("device", DEVICES)
def test_small_tensors_batched_statistics_equal_their_own_reductions(device: str) -> None:
    """Small tensors are copied and reduced row by row at the flush: every value is the one the tensor's
    own reductions give (msprobe's torch.max/min/mean/norm on the CPU, the Mean and Norm in float64 on an
    accelerator or where the dtype's overflowed), bit for bit, NaN and inf included; a tensor
    updated in place after it was recorded keeps the statistics of its values when recorded."""
    gen = torch.Generator().manual_seed(0)
    tensors = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for shape in ((7,), (16, 48), (3, 5, 9), (300, 100), (40000,)):  # the last is past SMALL
            for scale in (1e-3, 1.0, 1e3):
                tensors.append(((torch.randn(shape, generator=gen) * scale) + 0.5).to(dtype))
    tensors[1].view(-1)[3] = float("nan")
    tensors[2].view(-1)[5] = float("inf")
    tensors += [torch.arange(-6, 30).view(4, 9), torch.tensor([[True, False]]), torch.ones(2, 2).t()]
    tensors = [t.to(device) for t in tensors]
    expected = []
    for t in tensors:
        if t.dtype is torch.bool:
            expected.append([t.any().item(), t.all().item()])
            continue
        # msprobe 8.3.3 computes the statistics of integers and float64 in float32
        x = t if t.is_floating_point() and t.dtype is not torch.float64 else t.float()
        mean, norm = x.mean(), torch.linalg.vector_norm(x)
        wide = devices.host_dtype(x.device)
        finite = bool(x.max().isfinite() and x.min().isfinite())
        if x.device.type != "cpu" or not (mean.isfinite() and norm.isfinite()) and finite:
            # an accelerator's, and a CPU sum that overflowed its dtype (a float16 norm), in float64
            mean, norm = x.mean(dtype=wide), torch.linalg.vector_norm(x, dtype=wide)
        expected.append([v.item() for v in (x.max(), x.min(), mean, norm)])
    buf = StatsBuffer(md5=False)
    with quiet():
        leaves = [buf.leaf(t) for t in tensors]
        for t in tensors:
            t.zero_()  # after recording: the dump keeps the values as they were
        buf.resolve()
    for t, leaf, want in zip(tensors, leaves, expected, strict=True):
        keys = ("Max", "Min") if t.dtype is torch.bool else ("Max", "Min", "Mean", "Norm")
        got = [leaf[k] for k in keys]
        # an accelerator's row reductions may sum in another order than its whole-tensor ones: a few ulps
        rel = 0.0 if device == "cpu" or not t.is_floating_point() else 4 * torch.finfo(t.dtype).eps
        assert got == pytest.approx(want, rel=rel, abs=0, nan_ok=True), (t.dtype, tuple(t.shape))


def test_statistics_filled_later_except_when_a_long_step_resolves_early() -> None:
    """The flush's reductions and fill run as a ``fill_later`` job (the writer thread's); a step that stages
    more than ``MAX_STAGED`` elements resolves those at once, so no more copies than that are ever held."""
    jobs: list[Any] = []
    buf = StatsBuffer(md5=False, fill_later=jobs.append)
    buf.MAX_STAGED = 8
    with quiet():
        early = [buf.leaf(torch.full((3,), float(i))) for i in range(3)]  # 9 elements: resolved at the third
        late = buf.leaf(torch.tensor([1.0, 3.0]))
        buf.resolve()
    assert [leaf["Max"] for leaf in early] == [0.0, 1.0, 2.0] and not jobs[:-1]
    assert late["Max"] is None and len(jobs) == 1
    jobs[0]()
    assert (late["Max"], late["Min"], late["Mean"]) == (3.0, 1.0, 2.0)


def test_a_step_mixing_devices_is_dumped_whole(tmp_path: Path) -> None:
    """Real CPU calls and calls on a (fake) ``cuda:0`` in one step: the step's dump.json is written whole."""
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    PrecisionDebugger.start()
    a = torch.ones(3) * 2
    with FakeTensorMode():
        b = torch.ones(4, device="cuda")
        torch.relu(b)
    torch.relu(a)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)
    relus = [v for k, v in data.items() if k.startswith("Torch.relu.")]
    assert len(relus) == 2
    fake_in, real_in = (r["input_args"][0] for r in relus)
    assert fake_in["Max"] is None and fake_in["shape"] == [4] and fake_in["dtype"] == "torch.float32"
    assert fake_in["note"].startswith("fake tensor")
    assert real_in["Max"] == 2.0


# ------------------------------------------------------------------------------------- a training step
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_training_step_with_adamw_inside_start_stop(tmp_path: Path, device: str, level: str) -> None:
    """The usual placement: ``optimizer.step()`` before ``stop()``; AdamW's ``step`` counters live on the
    host while the weights live on ``device``."""
    torch.manual_seed(0)
    model = MLP().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, device=device)
    PrecisionDebugger(dump_path=str(tmp_path), level=level)
    for _ in range(2):
        PrecisionDebugger.start(model)
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    counters = {t.device.type for s in opt.state.values() for t in [s["step"]]}
    data = load_data(tmp_path, step=1)
    leaves = [leaf for v in data.values() for leaf in _leaves(v)]
    readable = [leaf for leaf in leaves if leaf["dtype"] != "torch.bool" and math.prod(leaf["shape"]) > 0]
    assert readable and all(leaf["Max"] is not None for leaf in readable)
    # the optimizer ran inside the step and its 0-d step counters (value 2 in step 1) were recorded
    assert counters == {"cpu"}
    assert any(leaf["shape"] == [] and leaf["Max"] == 2.0 for leaf in leaves), "no step counter recorded"
    if level == "mix":
        assert any(k.startswith("Module.fc1.Linear.forward.") for k in data)


def test_meta_model_records_dtype_and_shape(tmp_path: Path) -> None:
    with torch.device("meta"):
        model = nn.Linear(4, 2)
    PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    PrecisionDebugger.start(model)
    model(torch.ones(3, 4, device="meta")).sum()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    doc = json.loads((tmp_path / "step0" / "rank0" / "dump.json").read_text())
    linear = doc["data"]["Functional.linear.0.forward"]
    assert linear["output"][0]["shape"] == [3, 2]
    assert linear["output"][0]["Max"] is None and linear["output"][0]["note"].startswith("meta tensor")
    # the compare engine reads such a dump (the note is a key it ignores): every row is there, none compared
    # (imported here: accelerator_check.sh installs the light client, without the [compare] extra)
    engine = pytest.importorskip("parity.shared.compare.engine")
    options = pytest.importorskip("parity.shared.compare.options")
    dump_json = tmp_path / "step0" / "rank0" / "dump.json"
    result = engine.compare_dumps(dump_json, dump_json, options.CompareOptions())
    assert len(result.rows) >= 3


# ----------------------------------------------------------------------------------------- device module
@pytest.mark.parametrize("device", DEVICES)
def test_to_host_brings_each_device_once(device: str) -> None:
    dev = torch.device(device)
    parts = {
        torch.device("cpu"): [torch.tensor([1.0, 2.0], dtype=torch.float64)],
        dev: [torch.tensor([3.0], dtype=devices.host_dtype(dev), device=dev),
              torch.tensor([4.0, 5.0], dtype=devices.host_dtype(dev), device=dev)],
    }  # fmt: skip
    host = devices.to_host(parts)
    assert all(t.device.type == "cpu" for t in host.values())
    if device == "cpu":
        assert host[dev].tolist() == [3.0, 4.0, 5.0]
    else:
        assert host[torch.device("cpu")].tolist() == [1.0, 2.0]
        assert host[dev].tolist() == [3.0, 4.0, 5.0]


@pytest.mark.parametrize("device", DEVICES)
def test_streams_and_sync_degrade_on_cpu(device: str) -> None:
    dev = torch.device(device)
    stream = devices.side_stream(dev)
    if device == "cpu":
        assert stream is None
    x = torch.arange(6.0, device=dev)
    with devices.stream_context(stream):
        y = x * 2
    devices.synchronize(dev)
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    buf = devices.pinned_empty(6, torch.float32)
    assert buf.device.type == "cpu" and buf.numel() == 6
    assert buf.is_pinned() == (devices.accelerator() is not None)


def test_unreadable_tensors_are_named() -> None:
    assert devices.unreadable(torch.ones(2)) is None
    assert devices.unreadable(nn.Parameter(torch.ones(2))) is None
    assert devices.unreadable(torch.empty(2, device="meta")) == "meta tensor"
    with FakeTensorMode():
        fake = torch.ones(2)
    assert devices.unreadable(fake) == "fake tensor"
    functional = torch._to_functional_tensor(torch.ones(2))
    assert devices.unreadable(functional) == "functional tensor"


def test_available_devices_start_with_cpu() -> None:
    found = devices.available_devices()
    assert found[0] == "cpu"
    assert len(found) == (1 if devices.accelerator() is None else 2)


# --------------------------------------------------------------------------------- tensor mode's host copies
@pytest.mark.parametrize("device", DEVICES)
def test_staged_copies_are_bounded_and_exact(tmp_path: Path, device: str) -> None:
    """Device tensors go through bounded host buffers (forced on CPU, where it is a plain copy): while the
    writer is held, training blocks at the bound instead of holding more bytes; every file is exact."""
    writer = BackgroundWriter(max_host_bytes=1000)
    gate = threading.Event()
    writer.submit_call(lambda: gate.wait(30))  # the writer thread holds here until the gate opens
    tensors = [torch.full((100,), float(i), device=device) for i in range(4)]  # 400 bytes each

    def produce() -> None:
        for i, t in enumerate(tensors):
            writer.submit(tmp_path / f"t{i}.pt", t, staged=True)
            t.add_(100)  # a later in-place update must not reach the saved copy

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join(timeout=2)
    blocked = producer.is_alive()  # two copies fit the bound; the third waits for the writer
    held = writer.staged_bytes
    gate.set()
    producer.join(timeout=30)
    writer.drain()
    assert blocked and held == 800
    assert writer.peak_staged_bytes <= 1000 and writer.staged_bytes == 0
    for i in range(4):
        saved = torch.load(tmp_path / f"t{i}.pt", weights_only=True)
        assert saved.device.type == "cpu" and saved.tolist() == [float(i)] * 100
    writer.close()


def test_host_buffer_setting_is_validated(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "tensor", "host_buffer_mb": 0}))
    with pytest.raises(ConfigError, match="host_buffer_mb"):
        load_config(cfg)
    cfg.write_text(json.dumps({"task": "tensor", "host_buffer_mb": 64}))
    assert load_config(cfg).host_buffer_mb == 64


def test_hooked_models_are_tracked_weakly(tmp_path: Path) -> None:
    """A freed model leaves the hooks' table (an ``id()`` could be reused by the next model)."""
    import gc

    PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    model = MLP()
    PrecisionDebugger.start(model)
    model(torch.ones(1, 8))
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    hooks = PrecisionDebugger._get()._modules
    assert len(hooks._attached) == 1
    del model
    gc.collect()
    assert len(hooks._attached) == 0
    again = MLP()
    PrecisionDebugger.start(again)  # a new model, whatever its address, is hooked
    again(torch.ones(1, 8))
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    assert any(k.startswith("Module.fc1.Linear.forward.") for k in load_data(tmp_path, step=1))


def test_heap_frozen_while_recording_and_thawed_after(tmp_path: Path) -> None:
    import gc

    # Another test in this worker may have frozen the heap (an in-process server does): start thawed.
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    PrecisionDebugger.start()
    during = gc.get_freeze_count()
    torch.relu(torch.ones(2))
    PrecisionDebugger.stop()
    assert during > 0 and gc.get_freeze_count() == 0
    gc.freeze()  # the process froze its own heap (before forking workers): left as it is
    try:
        own = gc.get_freeze_count()
        PrecisionDebugger.start()
        PrecisionDebugger.stop()
        assert gc.get_freeze_count() == own
    finally:
        gc.unfreeze()
    PrecisionDebugger.step()
    assert "Torch.relu.0.forward" in load_data(tmp_path)


def test_young_generation_threshold_raised_while_recording_and_restored_after(tmp_path: Path) -> None:
    import gc

    before = gc.get_threshold()
    gc.set_threshold(700, 11, 12)
    try:
        PrecisionDebugger(dump_path=str(tmp_path), level="L1")
        PrecisionDebugger.start()
        assert gc.get_threshold() == (PrecisionDebugger.GC_YOUNG, 11, 12)
        torch.relu(torch.ones(2))
        PrecisionDebugger.stop()
        # raised until step() hands the step's entries over (a collection now would walk them all)...
        assert gc.get_threshold() == (PrecisionDebugger.GC_YOUNG, 11, 12)
        PrecisionDebugger.start()  # ...and a second start() in the step keeps the user's ones to restore
        torch.relu(torch.ones(2))
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
        assert gc.get_threshold() == (700, 11, 12)
        gc.set_threshold(500_000, 11, 12)  # a process that set a higher one keeps it
        PrecisionDebugger.start()
        assert gc.get_threshold() == (500_000, 11, 12)
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
        gc.set_threshold(0)  # nor is a disabled collector turned on
        PrecisionDebugger.start()
        assert gc.get_threshold()[0] == 0
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_steps_entries_are_freed_at_step_without_the_collector(tmp_path: Path, level: str) -> None:
    """A recorder outlives its step (its ApiBackward calls back into it; hooks of tensors that outlive the
    step hold it), so the step's entries, leaves and watched views must be let go at ``step()``: left to
    the collector, its next pass walked all of them (~12% of the host cost). Counted with the collector
    off: what is still tracked after the step is the recorder's own few objects, not its entries."""
    import gc

    def one_step(model: nn.Module, x: torch.Tensor) -> None:
        PrecisionDebugger.start(model)
        y = model(x).view(-1)[:4]  # a view: watched in case it is changed in place
        for _ in range(100):
            y = torch.relu(y) * 1.0
        y.sum().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()

    PrecisionDebugger(dump_path=str(tmp_path), level=level)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    one_step(model, x)  # the process-wide caches are filled
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        one_step(model, x)
        left = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert len(load_data(tmp_path, step=1)) > 200  # 200 calls and their backward: thousands of objects
    assert left < 1000, left  # over 2,000 when they waited for the collector


def test_md5_of_device_tensors_comes_from_the_writer_thread() -> None:
    """md5 off the CPU: the CRC of a host copy taken when the call was recorded, filled in by the writer
    thread before any document written after it (forced on CPU, where it would be computed at once)."""
    from parity.client.stats import crc32_hex

    writer = BackgroundWriter()
    gate = threading.Event()
    writer.submit_call(lambda: gate.wait(30))
    buf = StatsBuffer(md5=True, stage=writer.submit_host, stage_cpu=True)
    t = torch.arange(12, dtype=torch.float32)
    expected = crc32_hex(t.clone())
    with quiet():
        first = buf.leaf(t)
        shared = buf.leaf(t)  # the same tensor, unchanged: shares the first leaf's statistics and CRC
        t.add_(1)  # changed after it was recorded: the CRC is of the recorded value
        later = buf.leaf(t)
        buf.resolve()
    assert list(first) == list(later) and "md5" in first and first["md5"] is None  # key in place, no value
    gate.set()
    writer.drain()
    assert first["md5"] == shared["md5"] == expected
    assert later["md5"] == crc32_hex(t) != expected
    assert first["Max"] == 11.0 and later["Max"] == 12.0
    writer.close()
