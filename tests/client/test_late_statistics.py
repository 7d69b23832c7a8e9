"""Parameters' and their gradients' statistics are read in batches (StatsBuffer.later / take_later): a
forward's parameters when the model returns, a backward's gradients when it ends. These tests pin down that
the numbers are still those of the values at the call: the optimizer's update, an in-place clip, a second
accumulation and a backward that fails must not show in them, or show as msprobe's hook would see them."""

from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.client.stats import StatsBuffer, crc32_hex, quiet
from torch import nn

from tests.client.conftest import MLP, load_data

FC1 = "Module.fc1.Linear"
FC2 = "Module.fc2.Linear"


def stats_of(t: torch.Tensor) -> tuple[float, float, float, float]:
    t = t.detach()
    return (t.max().item(), t.min().item(), t.mean().item(), torch.linalg.vector_norm(t).item())


def leaf_stats(leaf: dict[str, Any]) -> tuple[float, float, float, float]:
    return (leaf["Max"], leaf["Min"], leaf["Mean"], leaf["Norm"])


def _debugger(tmp_path: Path, level: str = "L0") -> None:
    PrecisionDebugger(dump_path=str(tmp_path), level=level)


def test_forward_parameters_are_the_values_before_the_optimizer_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=10.0)
    _debugger(tmp_path)
    PrecisionDebugger.start(model)
    model(x).pow(2).mean().backward()
    opt.step()  # inside start/stop, the usual placement: it rewrites every parameter in place
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)
    for mod, attr in ((FC1, "fc1"), (FC2, "fc2")):
        params = data[f"{mod}.forward.0"]["parameters"]
        for pname in ("weight", "bias"):
            assert leaf_stats(params[pname]) == pytest.approx(stats_of(before[f"{attr}.{pname}"]), rel=1e-6)
            assert params[pname]["requires_grad"] is True
            assert params[pname]["shape"] == list(before[f"{attr}.{pname}"].shape)


def test_gradients_are_those_the_backward_accumulated_not_the_clipped_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 8)
    _debugger(tmp_path)
    PrecisionDebugger.start(model)
    model(x).pow(2).mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-6)  # in place, after the backward
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)
    for mod, attr in ((FC1, "fc1"), (FC2, "fc2")):
        entry = data[f"{mod}.parameters_grad"]
        for pname in ("weight", "bias"):
            (leaf,) = entry[pname]
            assert leaf_stats(leaf) == pytest.approx(stats_of(grads[f"{attr}.{pname}"]), rel=1e-6)
            # and visibly not the clipped gradient's
            assert leaf["Norm"] > 1e3 * torch.linalg.vector_norm(model.get_parameter(f"{attr}.{pname}").grad)


def test_two_accumulations_in_one_step_record_the_sum(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 8)
    _debugger(tmp_path)
    PrecisionDebugger.start(model)
    model(x).pow(2).mean().backward()
    model(x * 2).pow(2).mean().backward()  # a second micro-batch adds to .grad in place
    total = model.fc1.weight.grad.detach().clone()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    (leaf,) = load_data(tmp_path)[f"{FC1}.parameters_grad"]["weight"]
    assert leaf_stats(leaf) == pytest.approx(stats_of(total), rel=1e-6)


def test_a_backward_that_fails_midway_keeps_the_gradients_it_had(tmp_path: Path) -> None:
    """The end-of-backward callback never runs when a hook raises; the next backward (or the flush) reads
    the gradients waiting, and the step is written."""
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 8)
    _debugger(tmp_path)
    PrecisionDebugger.start(model)
    hidden = model.act(model.fc1(x))

    def fail(_: torch.Tensor) -> None:
        raise RuntimeError("a hook failed")

    hidden.register_hook(fail)  # fc2's gradients are accumulated before this fires
    with pytest.raises(RuntimeError, match="a hook failed"):
        model.fc2(hidden).pow(2).mean().backward()
    fc2_grad = model.fc2.weight.grad.detach().clone()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    (leaf,) = load_data(tmp_path)[f"{FC2}.parameters_grad"]["weight"]
    assert leaf_stats(leaf) == pytest.approx(stats_of(fc2_grad), rel=1e-6)


class WritesAfterUse(nn.Module):
    """A forward that writes a submodule's weight in place after that submodule ran."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        with torch.no_grad():
            self.fc1.weight.mul_(2.0)
        return self.fc2(h)


def test_a_parameter_written_in_place_during_the_forward_is_noted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = WritesAfterUse()
    _debugger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="parity.client.recorder"):
        PrecisionDebugger.start(model)
        model(torch.randn(2, 8)).sum().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    params = load_data(tmp_path)[f"{FC1}.forward.0"]["parameters"]
    assert "written in place" in params["weight"]["note"]
    assert "note" not in params["bias"]
    assert any("written in place during the forward" in r.getMessage() for r in caplog.records)


def test_later_matches_leaf_bit_for_bit_and_follows_a_parameter_that_changed() -> None:
    """The batched path gives the numbers the one-by-one path gives; a parameter whose storage changed
    (``.half()``, ``.data =``) is looked at again, not served from the process-wide cache."""
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    for _ in range(2):  # the second time from the cache of checks
        eager, batched = StatsBuffer(md5=False), StatsBuffer(md5=False)
        with quiet():
            expected = [eager.leaf(lin.weight), eager.leaf(lin.bias)]
            late = [batched.later(lin.weight), batched.later(lin.bias)]
            assert all(item is not None for item in late)
            batched.take_later([item for item in late if item is not None])
        eager.resolve(later=False)
        batched.resolve(later=False)
        assert [item[2] for item in late if item is not None] == expected
    lin.half()
    buf = StatsBuffer(md5=False)
    with quiet():
        item = buf.later(lin.weight)
        assert item is not None and item[2]["dtype"] == "torch.float16"
        buf.take_later([item])
    buf.resolve(later=False)
    assert leaf_stats(item[2]) == pytest.approx(stats_of(lin.weight))
    lin.weight.data = torch.zeros(2, 2, dtype=torch.float16)
    item = StatsBuffer(md5=False).later(lin.weight)
    assert item is not None and item[2]["shape"] == [2, 2]
    # float64: its statistics are computed in float32 (msprobe's), from a copy the one-by-one path makes
    assert StatsBuffer(md5=False).later(lin.double().weight) is None


@pytest.mark.parametrize("make", [lambda: torch.zeros(3, dtype=torch.int64), lambda: torch.empty(0),
                                  lambda: torch.randn(4, 4).t(), lambda: torch.tensor(1.0)])  # fmt: skip
def test_later_leaves_what_it_cannot_batch_to_leaf(make: Any) -> None:
    assert StatsBuffer(md5=False).later(make()) is None
    assert StatsBuffer(md5=True).later(torch.randn(3)) is None


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_a_modules_own_parameters_are_named_parameters_without_recursion(extra: int) -> None:
    """The recorder's copy of ``named_parameters(recurse=False)``: in order, a parameter under two names
    listed once (under its first), ``None`` slots skipped."""
    from parity.client.recorder import own_parameters

    lin = nn.Linear(3, 2)
    lin.register_parameter("missing", None)
    for i in range(extra):
        lin.register_parameter(f"again{i}", lin.weight)
    lin.register_parameter("own", nn.Parameter(torch.zeros(1)))
    expected = [(n, p) for n, p in lin.named_parameters(recurse=False)]
    got = own_parameters(lin)
    assert [n for n, _ in got] == [n for n, _ in expected] == ["weight", "bias", "own"]
    assert all(a is b for (_, a), (_, b) in zip(got, expected, strict=True))
    single = nn.Module()
    single.w = nn.Parameter(torch.ones(2))
    single.register_parameter("alias", single.w)
    assert [n for n, _ in own_parameters(single)] == ["w"]


def test_a_storage_freed_before_its_statistics_are_read_is_noted_not_read() -> None:
    """FSDP frees a gathered parameter's storage (``resize_(0)``) when its unit reshards: a parameter whose
    statistics waited must not be read past the end of its storage (a segfault), only noted."""
    buf = StatsBuffer(md5=False)
    kept, freed = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(4, 3))
    pending = [buf.later(kept), buf.later(freed)]
    assert None not in pending
    freed.untyped_storage().resize_(0)
    buf.take_later(pending)  # type: ignore[arg-type]
    buf.resolve()
    assert leaf_stats(pending[0][2]) == pytest.approx(stats_of(kept))  # type: ignore[index]
    freed_leaf = pending[1][2]  # type: ignore[index]
    assert freed_leaf["Max"] is None and "storage freed" in freed_leaf["note"]
    assert buf.unreadable == 1


def test_an_md5_leaves_the_storage_resizable() -> None:
    """The CRC reads the bytes in place without a numpy view, which would pin the storage's size for good
    (FSDP's ``resize_(0)`` then fails: "Trying to resize storage that is not resizable")."""
    t = torch.arange(6, dtype=torch.float32)
    assert crc32_hex(t) == f"{zlib.crc32(t.clone().numpy().tobytes()) & 0xFFFFFFFF:08x}"
    assert crc32_hex(torch.empty(0)) == "00000000"
    t.untyped_storage().resize_(0)  # raises where a numpy view pinned it
