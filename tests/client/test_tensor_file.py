"""The cached tensor-file serializer writes exactly ``torch.save``'s bytes, for every kind of tensor."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from parity.client.tensor_file import TensorFiles
from parity.client.tensor_writer import _save


def _torch_save(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _cases() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    cases = [(f"{dt}", (base * 10).to(dt)) for dt in (
        torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
        torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)]  # fmt: skip
    for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32"):  # the "v3" dtypes, where torch has them
        if hasattr(torch, name):
            cases.append((name, base.to(getattr(torch, name))))
    cases += [
        ("0-d", torch.tensor(3.5)),
        ("0-d bf16", torch.tensor(-1.25, dtype=torch.bfloat16)),
        ("empty", torch.empty(0, 3)),
        ("empty 1-d int", torch.empty(0, dtype=torch.int64)),
        ("transposed", base.t()),
        ("strided slice", base[:, ::2]),
        ("view at an offset", base.flatten()[5:11]),
        ("expanded", torch.randn(1, 3, generator=g).expand(4, 3)),
        ("large", torch.randn(64, 1024, generator=g)),
    ]
    return cases


@pytest.mark.parametrize(("name", "tensor"), _cases(), ids=[n for n, _ in _cases()])
def test_bytes_equal_torch_save_and_load_back(name: str, tensor: torch.Tensor) -> None:
    files = TensorFiles()
    first = bytes(files.encode(tensor))  # records the layout
    again = bytes(files.encode(tensor))  # replays the cached records
    assert first == _torch_save(tensor), name
    assert again == first, name
    assert len(files._archives) == 1 and None not in files._archives.values()  # the fast path, not torch.save
    loaded = torch.load(io.BytesIO(again), weights_only=True)
    assert (loaded.dtype, loaded.shape, loaded.stride()) == (tensor.dtype, tensor.shape, tensor.stride())
    assert torch.equal(_raw(loaded), _raw(tensor))


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The values' bytes (torch.equal has no kernel for some dtypes)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_cached_layout_carries_the_new_values() -> None:
    """A second tensor of a cached layout gets its own data (and CRC), not the first one's."""
    files = TensorFiles()
    a, b = torch.zeros(3, 5), torch.arange(15.0).view(3, 5)
    files.encode(a)
    out = bytes(files.encode(b))
    assert out == _torch_save(b)
    assert torch.equal(torch.load(io.BytesIO(out), weights_only=True), b)
    assert len(files._archives) == 1


@pytest.mark.parametrize("kind", ["requires_grad", "conj", "subclass", "python attribute"])
def test_tensors_that_are_not_plain_go_through_torch_save(kind: str) -> None:
    t = torch.randn(2, 3)
    if kind == "requires_grad":
        t.requires_grad_(True)
    elif kind == "conj":
        t = torch.randn(2, 3, dtype=torch.complex64).conj()
    elif kind == "subclass":
        t = torch.nn.Parameter(t)
    else:
        t.note = "kept by pickle"  # type: ignore[attr-defined]
    files = TensorFiles()
    assert files._layout(t, (True, 64)) is None
    assert bytes(files.encode(t)) == _torch_save(t)
    assert not files._archives


def test_save_writes_the_file_atomically(tmp_path: Path) -> None:
    """The writer thread's ``_save``: torch.save's bytes at the path, no temporary left behind."""
    files = TensorFiles()
    t = torch.randn(3, 7).to(torch.bfloat16)
    for sync in (True, False):
        path = tmp_path / f"x{sync}.pt"
        _save(t, path, sync=sync, files=files)
        assert path.read_bytes() == _torch_save(t)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["xFalse.pt", "xTrue.pt"]


def test_save_names_the_file_it_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "x.pt"
    with pytest.raises(OSError, match="missing/x.pt"):
        _save(torch.ones(2), path)
