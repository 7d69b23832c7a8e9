"""The cached tensor-file serializer writes exactly ``torch.save``'s bytes, for every kind of tensor."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from parity.client import tensor_file
from parity.client.tensor_file import TensorFiles, _Template
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


def _flip_storage(t: torch.Tensor) -> None:
    """Change the first and last byte of ``t``'s storage in place (every byte the file holds is storage)."""
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    if raw.numel():
        raw[0] ^= 0xFF
        raw[-1] ^= 0x3C


@pytest.mark.parametrize(("name", "tensor"), _cases(), ids=[n for n, _ in _cases()])
def test_a_layouts_byte_template_carries_new_values_crc_and_serialization_id(
    name: str, tensor: torch.Tensor
) -> None:
    """Every plain layout gets a byte template; a later tensor of that layout with other bytes gets its own
    storage, CRC-32s and serialization id: torch.save's file, byte for byte."""
    files = TensorFiles()
    assert bytes(files.encode(tensor)) == _torch_save(tensor), name
    (template,) = files._templates.values()
    assert isinstance(template, _Template), name
    _flip_storage(tensor)
    parts = files.parts(tensor)
    assert b"".join(parts) == _torch_save(tensor), name
    if tensor.untyped_storage().nbytes():  # the storage itself is written, not a copy of it
        assert parts[1] is not None and memoryview(parts[1]).nbytes == tensor.untyped_storage().nbytes()
    assert torch.equal(_raw(torch.load(io.BytesIO(b"".join(parts)), weights_only=True)), _raw(tensor))


def test_a_storage_above_the_template_bound_is_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_file, "TEMPLATE_MAX_BYTES", 64)
    files = TensorFiles()
    small, large = torch.arange(4.0), torch.arange(100.0)
    for t in (small, large, large + 1):
        assert bytes(files.encode(t)) == _torch_save(t)
    assert [type(v).__name__ for v in files._templates.values()] == ["_Template", "NoneType"]


def test_a_template_that_does_not_reproduce_torch_save_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The template is checked against a second archive when learnt: a wrong serialization-id hash (another
    torch's formula) fails that check, and the layout is replayed, still torch.save's bytes."""
    monkeypatch.setattr(tensor_file, "_hash_combine", lambda seed, value: seed + value)
    files = TensorFiles()
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    assert bytes(files.encode(a)) == _torch_save(a)
    assert bytes(files.encode(b)) == _torch_save(b)
    assert list(files._templates.values()) == [None]


@pytest.mark.parametrize("crc32", [True, False])
def test_templates_follow_torch_saves_crc_option(crc32: bool) -> None:
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc32)
    try:
        files = TensorFiles()
        a, b = torch.randn(2, 5).to(torch.bfloat16), torch.randn(2, 5).to(torch.bfloat16)
        assert bytes(files.encode(a)) == _torch_save(a)
        assert bytes(files.encode(b)) == _torch_save(b)
    finally:
        torch.serialization.set_crc32_options(before)


def test_save_completes_a_short_writev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``writev`` may write less than asked (a signal, a full pipe): the rest follows in plain writes."""
    from parity.client import tensor_writer

    if not tensor_writer._WRITEV:
        pytest.skip("no writev on this platform")
    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, parts: real(fd, [bytes(parts[0])[:10]]))
    t = torch.randn(5, 7)
    _save(t, tmp_path / "x.pt", sync=False)
    assert (tmp_path / "x.pt").read_bytes() == _torch_save(t)


def test_save_writes_a_new_file_in_place_and_replaces_an_existing_one_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new name is written in place (no dump.json names it yet); an existing file, which one may name
    already, is written under a temporary name and renamed over it, so it is never seen half written."""
    renames: list[tuple[str, str]] = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((str(a), str(b))), real(a, b))[1])
    path = tmp_path / "g.pt"
    first, second = torch.randn(4, 3), torch.randn(4, 3)
    _save(first, path, sync=False)
    assert renames == [] and path.read_bytes() == _torch_save(first)
    _save(second, path, sync=False)
    assert renames == [(str(tmp_path / ".g.pt.tmp"), str(path))]
    assert path.read_bytes() == _torch_save(second)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt"]


@pytest.mark.parametrize("exists", [False, True])
def test_a_failed_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               exists: bool) -> None:  # fmt: skip
    """A write that fails (a full disk) removes what it created: no half new file, and an existing file
    keeps its complete old bytes."""
    from parity.client import tensor_writer

    path = tmp_path / "g.pt"
    old = torch.arange(6.0)
    if exists:
        _save(old, path, sync=False)

    def full_disk(fd: int, parts: object) -> None:
        os.write(fd, b"PK")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensor_writer, "_write_all", full_disk)
    with pytest.raises(OSError, match="g.pt"):
        _save(torch.randn(3), path, sync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["g.pt"] if exists else [])
    if exists:
        assert path.read_bytes() == _torch_save(old)
