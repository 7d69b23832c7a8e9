"""Safe tensor loading: pickle payloads refused without running, dtype rules, mmap, squeeze, caps."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from parity.shared.errors import DumpError, UnsafeFileError
from parity.shared.tensor_io import TensorLimits, load_tensor, open_tensor


class _Payload:
    """Pickles to a call of os.system: loading the file must never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _loaders() -> list[object]:
    return [load_tensor, open_tensor]


@pytest.mark.parametrize("loader", _loaders())
def test_pt_with_pickle_payload_is_refused_and_not_run(tmp_path: Path, loader: object) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "Torch.add.0.forward.output.0.pt"
    torch.save(_Payload(marker), evil)  # a real torch zip archive whose data.pkl calls os.system
    with pytest.raises(UnsafeFileError, match=r"Torch\.add\.0\.forward\.output\.0\.pt"):
        loader(evil)  # type: ignore[operator]
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("loader", _loaders())
def test_legacy_raw_pickle_pt_is_refused_and_not_run(tmp_path: Path, loader: object) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "legacy.pt"
    evil.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UnsafeFileError, match="legacy.pt"):
        loader(evil)  # type: ignore[operator]
    assert not marker.exists()


@pytest.mark.parametrize("loader", _loaders())
def test_object_npy_is_refused_and_not_run(tmp_path: Path, loader: object) -> None:
    marker = tmp_path / "marker"
    evil = tmp_path / "obj.npy"
    np.save(evil, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(UnsafeFileError, match="obj.npy"):
        loader(evil)  # type: ignore[operator]
    assert not marker.exists()


def test_bfloat16_becomes_float32_exactly(tmp_path: Path) -> None:
    t = torch.tensor([1.0, -2.5, 3.140625, 1e-3], dtype=torch.bfloat16)
    torch.save(t, tmp_path / "bf16.pt")
    arr = load_tensor(tmp_path / "bf16.pt")
    assert arr.dtype == np.float32 and np.array_equal(arr, t.float().numpy())
    raw = open_tensor(tmp_path / "bf16.pt")
    assert raw.bfloat16 and raw.array.dtype == np.uint16
    assert np.array_equal(raw.to_numpy(), arr)


def test_float8_becomes_float32(tmp_path: Path) -> None:
    t = torch.tensor([0.5, -1.0, 2.0]).to(torch.float8_e4m3fn)
    torch.save(t, tmp_path / "f8.pt")
    for arr in (load_tensor(tmp_path / "f8.pt"), open_tensor(tmp_path / "f8.pt").to_numpy()):
        assert arr.dtype == np.float32 and arr.tolist() == [0.5, -1.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int64, torch.int8,
                                   torch.uint8, torch.bool])  # fmt: skip
def test_other_dtypes_keep_their_dtype_in_both_loaders(tmp_path: Path, dtype: torch.dtype) -> None:
    t = (torch.arange(12).reshape(3, 4) - 5).to(dtype)
    torch.save(t.requires_grad_(dtype.is_floating_point), tmp_path / "t.pt")
    expected = t.detach().numpy()
    slow, fast = load_tensor(tmp_path / "t.pt"), open_tensor(tmp_path / "t.pt")
    assert slow.dtype == expected.dtype and np.array_equal(slow, expected)
    assert not fast.bfloat16 and fast.array.dtype == expected.dtype and np.array_equal(fast.array, expected)


def test_saved_views_load_with_their_own_offset_and_strides(tmp_path: Path) -> None:
    base = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    for i, view in enumerate([base[1:4, 2:5], base.t(), base[:, 3], base.reshape(-1)[7:19]]):
        torch.save(view, tmp_path / f"v{i}.pt")
        assert np.array_equal(open_tensor(tmp_path / f"v{i}.pt").array, view.numpy())
        assert np.array_equal(load_tensor(tmp_path / f"v{i}.pt"), view.numpy())


def test_fast_reader_memory_maps_and_squeezes(tmp_path: Path) -> None:
    torch.save(torch.ones(1, 4), tmp_path / "a.pt")
    raw = open_tensor(tmp_path / "a.pt")
    assert raw.array.shape == (4,) and not raw.array.flags.writeable
    base = raw.array
    while base.base is not None and not isinstance(base, np.memmap):
        base = base.base  # type: ignore[assignment]
    assert isinstance(base, np.memmap)
    assert load_tensor(tmp_path / "a.pt").shape == (4,)


def test_npy_is_memory_mapped_and_squeezed(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(4, dtype=np.float32).reshape(1, 4, 1))
    arr = load_tensor(tmp_path / "a.npy")
    assert arr.shape == (4,) and arr.dtype == np.float32
    base = arr
    while base.base is not None and not isinstance(base, np.memmap):
        base = base.base  # type: ignore[assignment]
    assert isinstance(base, np.memmap)


def test_one_element_tensor_squeezes_to_zero_d(tmp_path: Path) -> None:
    torch.save(torch.tensor([2.5]), tmp_path / "one.pt")
    assert load_tensor(tmp_path / "one.pt").shape == () and open_tensor(tmp_path / "one.pt").array.shape == ()


def test_size_cap_refuses_big_files(tmp_path: Path) -> None:
    torch.save(torch.zeros(1000), tmp_path / "big.pt")
    with pytest.raises(UnsafeFileError, match="over the 100-byte cap"):
        load_tensor(tmp_path / "big.pt", limits=TensorLimits(max_file_bytes=100))
    with pytest.raises(UnsafeFileError, match="big.pt"):
        open_tensor(tmp_path / "big.pt", limits=TensorLimits(max_file_bytes=200))
    assert open_tensor(tmp_path / "big.pt").array.shape == (1000,)  # the default cap: 10 GiB


def test_the_cli_reads_the_caps_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library never reads the environment (a library user passes TensorLimits); the entry points do."""
    from parity.process_policy import tensor_limits

    assert tensor_limits({}) == TensorLimits()
    env = {"PARITY_MAX_TENSOR_FILE_BYTES": "200", "PARITY_MAX_TENSOR_ELEMENTS": "7"}
    assert tensor_limits(env) == TensorLimits(max_file_bytes=200, max_elements=7)
    assert tensor_limits({"PARITY_MAX_TENSOR_ELEMENTS": "0"}) == TensorLimits()  # ignored, with a warning
    monkeypatch.setenv("PARITY_MAX_TENSOR_FILE_BYTES", "200")
    assert tensor_limits().max_file_bytes == 200


def test_missing_file_is_a_dump_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="nope.pt: tensor file not found") as info:
        load_tensor(tmp_path / "nope.pt")
    assert not isinstance(info.value, UnsafeFileError)


def test_non_tensor_payload_is_a_dump_error(tmp_path: Path) -> None:
    torch.save({"a": torch.ones(2)}, tmp_path / "dict.pt")
    for loader in (load_tensor, open_tensor):
        with pytest.raises(DumpError, match="holds a dict, not a single tensor"):
            loader(tmp_path / "dict.pt")


def test_corrupt_and_unknown_files_are_dump_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    (tmp_path / "x.bin").write_bytes(b"\0" * 8)
    for name in ("bad.pt", "bad.npy", "x.bin"):
        with pytest.raises(DumpError, match=name.replace(".", r"\.")) as info:
            open_tensor(tmp_path / name)
        assert not isinstance(info.value, UnsafeFileError)
