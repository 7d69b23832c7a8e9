"""``summary_mode: "xor"``: msprobe 26's checksum, bit for bit, on the CPU path and the device path.

The reference is msprobe 26.2.0's own fold (``msprobe.pytorch.xor_checksum._xor_checksum_fallback``, its
halving loop as written there); the tests against msprobe's installed code are in tests/interop.
"""

from __future__ import annotations

import json

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.client.xor_checksum import XorChecksums, xor_hex, xor_words


def msprobe_fold(tensor: torch.Tensor) -> int:
    """msprobe 26.2.0's ``_xor_checksum_fallback``: bytes padded to 8, int64 words folded in halves."""
    bytes_tensor = tensor.contiguous().view(torch.uint8).flatten()
    numel = bytes_tensor.numel()
    if numel % 8 != 0:
        bytes_tensor = torch.nn.functional.pad(bytes_tensor, (0, 8 - numel % 8), "constant", 0)
    if bytes_tensor.storage_offset() % 8 != 0:
        bytes_tensor = bytes_tensor.clone()
    words = bytes_tensor.view(torch.int64)
    numel = words.numel()
    while numel > 1:
        if numel % 2 != 0:
            words = torch.nn.functional.pad(words, (0, 1), "constant", 0)
        words = words.view(2, -1)
        words = torch.bitwise_xor(words[0, :], words[1, :])
        numel = words.numel()
    return int(words[0])


CASES = [
    torch.randn(1000),
    torch.randn(7, 3).to(torch.float16),  # 42 bytes: a padded tail word
    torch.randn(5).to(torch.bfloat16),
    torch.arange(13, dtype=torch.int8),
    torch.tensor([True, False, True]),
    torch.randn(64, 33).t(),  # not contiguous
    torch.randn(100)[3:50],  # a view at an odd offset
    torch.randn(5000, dtype=torch.float64),
]


@pytest.mark.parametrize("tensor", CASES, ids=lambda t: f"{t.dtype}-{list(t.shape)}")
def test_both_paths_equal_msprobes_fold(tensor):
    expected = xor_hex(msprobe_fold(tensor))
    assert xor_hex(int(xor_words(tensor))) == expected  # the device path (torch kernels), run on the CPU
    leaf: dict[str, object] = {}
    checks = XorChecksums()
    checks.add(tensor, leaf)
    assert leaf["md5"] == expected  # the CPU path (numpy's reduce)


def test_stacked_small_tensors_fold_like_each_alone(monkeypatch):
    """The flush's stacked fold (accelerator tensors) gives each tensor its own checksum."""
    checks = XorChecksums()
    tensors = [torch.randn(17), torch.randn(17), torch.randn(100_000), torch.tensor(2.5), torch.tensor(7)]
    leaves: list[dict[str, object]] = [{} for _ in tensors]
    monkeypatch.setattr(torch.Tensor, "is_cpu", property(lambda self: False))  # take the device path
    for t, leaf in zip(tensors, leaves, strict=True):
        checks.add(t, leaf)
    assert all("md5" not in leaf for leaf in leaves)  # filled at the flush
    checks.resolve()
    assert [leaf["md5"] for leaf in leaves[:3]] == [xor_hex(msprobe_fold(t)) for t in tensors[:3]]
    assert leaves[3]["md5"] == 2.5  # a 0-d tensor's checksum is its value, as msprobe writes it
    assert leaves[4]["md5"] == "0x0000000000000007"


def test_a_dump_in_xor_mode_has_msprobes_leaves(tmp_path):
    config = {"task": "statistics", "dump_path": str(tmp_path), "level": "L1",
              "statistics": {"summary_mode": "xor"}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(tmp_path / "config.json"))
    x = torch.randn(4, 8)
    debugger.start()
    y = torch.nn.functional.relu(x).sum()
    torch.zeros(0).add(1)
    debugger.stop()
    debugger.step()
    (dump_json,) = tmp_path.glob("step0/rank*/dump.json")
    data = json.loads(dump_json.read_text())["data"]
    leaf = data["Functional.relu.0.forward"]["input_args"][0]
    assert list(leaf) == ["type", "dtype", "shape", "md5", "requires_grad"]
    assert leaf["md5"] == xor_hex(msprobe_fold(x))
    assert data["Tensor.sum.0.forward"]["output"][0]["md5"] == y.item()
    empty = data["Tensor.add.0.forward"]["input_args"][0]
    assert empty["md5"] is None  # msprobe: an empty tensor gets no checksum
