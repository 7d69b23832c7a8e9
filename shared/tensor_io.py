"""The only place Parity opens tensor files: safe loaders that never run code from the file.

Two entry points:

* :func:`load_tensor` is msprobe's loading pipeline (compare.md §4.1) done safely: ``.pt`` through
  ``torch.load(weights_only=True, map_location="cpu", mmap=True)``, ``.npy`` through
  ``np.load(allow_pickle=False, mmap_mode="r")``; bfloat16 and float8 become float32, float16, ints and bools
  keep their dtype, and the result is ``np.squeeze``-d as msprobe v2 does (so ``[1, 4]`` vs ``[4]`` compare).
* :func:`open_tensor` gives the same array without importing torch for the files msprobe writes (a zip
  holding one plain tensor): it reads the tiny ``data.pkl`` with an unpickler that can build nothing but a
  storage reference, then memory-maps the stored bytes. bfloat16 comes back as its raw ``uint16`` bit
  patterns, flagged, so the fused kernel converts on the fly and nothing of the tensor's size is copied.
  Anything it does not recognise is handed to :func:`load_tensor`, so the two never disagree on what loads.

Why a second loader: importing torch costs ~1.9 s and ~180 MB of RSS per process, which would dominate a
compare pool's start-up and its memory; ``torch.load`` also copies bf16 tensors to float32.
"""

from __future__ import annotations

import io
import logging
import math
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from parity.shared.errors import DumpError, TensorTooLargeError, UnsafeFileError

logger = logging.getLogger(__name__)

#: Files above this size are refused, as msprobe does (10 GiB).
DEFAULT_MAX_TENSOR_FILE_BYTES = 10 * 2**30
#: Tensors with more elements are not compared (a row diagnostic says why). The size cap alone does not bound
#: the work: a 1.7 KB ``.pt`` can hold an ``expand``-ed view of 2**40 elements. 2**31 float32 elements are an
#: 8 GiB file, the largest a 10 GiB size cap lets through for the common dtype; the fused kernel reads them
#: in a few seconds.
DEFAULT_MAX_TENSOR_ELEMENTS = 2**31


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """The caps every tensor load applies. The core never reads them from the environment: the entry points
    do (``PARITY_MAX_TENSOR_FILE_BYTES`` and ``PARITY_MAX_TENSOR_ELEMENTS``: the CLI in
    ``parity.process_policy.tensor_limits``, the server in its ``Settings``) and pass them down."""

    max_file_bytes: int = DEFAULT_MAX_TENSOR_FILE_BYTES
    max_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS


DEFAULT_LIMITS = TensorLimits()

# torch storage class names (as they appear in data.pkl) -> the numpy dtype of their elements.
_STORAGE_DTYPES: dict[str, np.dtype[Any]] = {
    "FloatStorage": np.dtype(np.float32),
    "DoubleStorage": np.dtype(np.float64),
    "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(np.uint16),  # raw bits; flagged as bfloat16
    "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8),
    "BoolStorage": np.dtype(np.bool_),
}
_MAX_PICKLE_BYTES = 1 << 20  # a one-tensor data.pkl is ~200 bytes
_ZIP_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")


def _check_elements(path: Path, shape: tuple[int, ...], limits: TensorLimits) -> None:
    numel = math.prod(shape)
    cap = limits.max_elements
    if numel > cap:
        raise TensorTooLargeError(
            path, f"tensor of shape {list(shape)} has {numel} elements, over the cap of {cap} "
            "(PARITY_MAX_TENSOR_ELEMENTS); not compared",
        )  # fmt: skip


def _check_size(path: Path, limits: TensorLimits) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DumpError(path, "tensor file not found") from None
    except OSError as exc:
        raise DumpError(path, f"cannot read tensor file: {exc.strerror or exc}") from None
    cap = limits.max_file_bytes
    if size > cap:
        raise UnsafeFileError(path, f"tensor file is {size} bytes, over the {cap}-byte cap")


def load_tensor(path: Path, *, limits: TensorLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Load one dumped tensor as a numpy array, never unpickling anything but tensor data.

    Raises :class:`UnsafeFileError` for a file that needs pickle to load (an arbitrary object, an object
    ``.npy``) or is over the size cap, and :class:`DumpError` for a missing, corrupt or non-tensor file.
    """
    path = Path(path)
    _check_size(path, limits)
    suffix = path.suffix.lower()
    if suffix == ".pt":
        array = _load_pt_with_torch(path, limits)
    elif suffix == ".npy":
        array = _load_npy(path, limits)
    else:
        raise DumpError(path, f"unsupported tensor file type {suffix or '(none)'!r}: expected .pt or .npy")
    return np.squeeze(array)


def load_torch_tensor(path: Path, *, limits: TensorLimits = DEFAULT_LIMITS) -> Any:
    """Load one dumped tensor as a CPU ``torch.Tensor`` in its own dtype and shape (the float64 replay needs
    both), with the same refusals as :func:`load_tensor`: weights-only ``torch.load``, the size and element
    caps, dense tensors only. A ``.npy`` file is read with ``allow_pickle=False`` and wrapped."""
    import torch

    path = Path(path)
    _check_size(path, limits)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        array = np.array(_load_npy(path, limits))  # a private copy: the memory map is read-only
        return torch.from_numpy(array)
    if suffix != ".pt":
        raise DumpError(path, f"unsupported tensor file type {suffix or '(none)'!r}: expected .pt or .npy")
    return _load_pt_tensor(path, limits)


def _load_pt_tensor(path: Path, limits: TensorLimits) -> Any:
    """``torch.load(weights_only=True)`` of a file that must hold one dense tensor; returned detached."""
    import torch  # lazily: the compare engine runs without torch for .npy dumps and statistics mode

    try:
        try:
            obj = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            # legacy (pre-zip) serialisation cannot be memory-mapped; the weights-only unpickler still applies
            obj = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        reason = _weights_only_reason(exc)
        if "GLOBAL" in reason or "global" in reason or _is_pickle_or_zip(path):
            problem = f"refused: loading it would need pickle to run code ({reason})"
            raise UnsafeFileError(path, problem) from None
        raise DumpError(path, f"not a tensor file ({reason})") from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile, KeyError) as exc:
        raise DumpError(path, f"cannot load tensor file: {exc}") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpError(path, f"holds a {type(obj).__name__}, not a single tensor")
    _check_elements(path, tuple(obj.shape), limits)
    tensor = obj.detach()
    if tensor.layout is not torch.strided:
        raise DumpError(path, f"holds a {tensor.layout} tensor; only dense tensors are compared")
    return tensor


def _load_pt_with_torch(path: Path, limits: TensorLimits) -> np.ndarray:
    import torch

    tensor = _load_pt_tensor(path, limits)
    if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32, torch.float64):
        tensor = tensor.float()  # bfloat16 and the float8 family: numpy has no such dtype
    try:
        return tensor.numpy()
    except TypeError as exc:  # e.g. complex32
        raise DumpError(path, f"dtype {tensor.dtype} has no numpy equivalent: {exc}") from None


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _weights_only_reason(exc: Exception) -> str:
    """The informative line of torch's weights-only refusal, without its boilerplate."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    text = _ANSI_ESCAPE.sub("", str(exc))  # torch emphasises parts of the message with terminal escapes
    for line in text.splitlines():
        line = line.replace("WeightsUnpickler error:", "").strip()
        if line and not line.startswith(boilerplate):
            return line
    return type(exc).__name__


def _is_pickle_or_zip(path: Path) -> bool:
    """A pickle stream (protocol >= 2 starts with PROTO) or a torch zip archive, rather than random bytes."""
    with path.open("rb") as fh:
        head = fh.read(4)
    return head[:1] == b"\x80" or head == b"PK\x03\x04"


def _load_npy(path: Path, limits: TensorLimits) -> np.ndarray:
    try:
        with path.open("rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                _, _, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                _, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise DumpError(path, f"not a valid .npy file: {exc}") from None
    if dtype.hasobject:
        raise UnsafeFileError(path, "refused: an object array can only be loaded by running pickle")
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise UnsafeFileError(path, f"refused: {exc}") from None
        raise DumpError(path, f"cannot load .npy file: {exc}") from None
    except OSError as exc:
        raise DumpError(path, f"cannot load .npy file: {exc}") from None
    _check_elements(path, array.shape, limits)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("="))
    return np.asarray(array)


# --- torch-free memory-mapped reader ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawTensor:
    """A loaded tensor as the fused kernel wants it: ``array`` is squeezed and usually memory-mapped;
    when ``bfloat16`` is true it holds the raw ``uint16`` bit patterns of a bfloat16 tensor."""

    array: np.ndarray
    bfloat16: bool = False

    def to_numpy(self) -> np.ndarray:
        """The array :func:`load_tensor` returns: bfloat16 widened (exactly) to float32."""
        if not self.bfloat16:
            return self.array
        return (self.array.astype(np.uint32) << 16).view(np.float32)


class _NotPlainTensor(Exception):
    """data.pkl holds something other than one plain tensor: let torch's weights-only loader decide."""


@dataclass(frozen=True, slots=True)
class _StorageRef:
    dtype_name: str
    key: str
    numel: int


@dataclass(frozen=True, slots=True)
class _TensorRef:
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(
    storage: object, offset: object, size: object, stride: object, *_rest: object
) -> _TensorRef:
    if not (isinstance(storage, _StorageRef) and isinstance(offset, int) and isinstance(size, tuple)
            and isinstance(stride, tuple) and len(size) == len(stride)
            and all(isinstance(v, int) for v in (*size, *stride))):  # fmt: skip
        raise _NotPlainTensor("unexpected _rebuild_tensor_v2 arguments")
    return _TensorRef(storage, offset, size, stride)


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name


class _TensorPickleReader(pickle.Unpickler):
    """Builds only storage references: every other global is refused before anything is constructed."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return dict
        raise _NotPlainTensor(f"global {module}.{name}")

    def persistent_load(self, pid: Any) -> _StorageRef:
        if (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and isinstance(pid[4], int)):  # fmt: skip
            return _StorageRef(pid[1].name, pid[2], pid[4])
        raise _NotPlainTensor(f"persistent id {pid!r}")


def _member_data_offset(fh: Any, info: zipfile.ZipInfo) -> int:
    fh.seek(info.header_offset)
    header = fh.read(_ZIP_LOCAL_HEADER.size)
    if len(header) != _ZIP_LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise _NotPlainTensor("bad local zip header")
    fields = _ZIP_LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[-2], fields[-1]
    return int(info.header_offset + _ZIP_LOCAL_HEADER.size + name_len + extra_len)


def _open_pt_mmap(path: Path, limits: TensorLimits) -> RawTensor:
    file_size = path.stat().st_size
    with path.open("rb") as fh:
        try:
            zf = zipfile.ZipFile(fh)
        except zipfile.BadZipFile:
            raise _NotPlainTensor("not a zip archive") from None
        with zf:
            names = zf.namelist()
            pkl = next((n for n in names if n.endswith("/data.pkl") and n.count("/") == 1), None)
            if pkl is None:
                raise _NotPlainTensor("no data.pkl")
            prefix = pkl[: -len("data.pkl")]
            if f"{prefix}byteorder" in names and zf.read(f"{prefix}byteorder").strip() != b"little":
                raise _NotPlainTensor("big-endian storage")
            info = zf.getinfo(pkl)
            if info.file_size > _MAX_PICKLE_BYTES:
                raise _NotPlainTensor("data.pkl too large for one tensor")
            ref = _TensorPickleReader(io.BytesIO(zf.read(pkl))).load()
            if not isinstance(ref, _TensorRef):
                raise _NotPlainTensor(f"payload is {type(ref).__name__}")
            storage = ref.storage
            member = f"{prefix}data/{storage.key}"
            try:
                data_info = zf.getinfo(member)
            except KeyError:
                raise _NotPlainTensor(f"missing storage {member}") from None
            if data_info.compress_type != zipfile.ZIP_STORED:
                raise _NotPlainTensor("compressed storage")
            data_offset = _member_data_offset(fh, data_info)
    dtype = _STORAGE_DTYPES[storage.dtype_name]
    itemsize = dtype.itemsize
    size, stride = ref.size, ref.stride
    if any(s < 0 for s in size) or any(s < 0 for s in stride) or ref.offset < 0 or storage.numel < 0:
        raise _NotPlainTensor("negative size, stride or offset")
    if storage.numel * itemsize > data_info.file_size or data_offset + data_info.file_size > file_size:
        raise _NotPlainTensor("storage larger than its zip member")
    _check_elements(path, size, limits)
    if 0 in size:
        array: np.ndarray = np.zeros(size, dtype=dtype)
    else:
        last = ref.offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if last >= storage.numel:
            raise _NotPlainTensor("tensor view runs past its storage")
        base = np.memmap(path, dtype=dtype, mode="r", offset=data_offset, shape=(storage.numel,))
        array = np.lib.stride_tricks.as_strided(
            base[ref.offset :], shape=size, strides=tuple(s * itemsize for s in stride), writeable=False
        )
    return RawTensor(np.squeeze(array), bfloat16=storage.dtype_name == "BFloat16Storage")


def open_tensor(path: Path, *, limits: TensorLimits = DEFAULT_LIMITS) -> RawTensor:
    """Open one dumped tensor for comparison, memory-mapped and without importing torch when possible.

    Same refusals and errors as :func:`load_tensor`, which it falls back to for any ``.pt`` that is not one
    plain tensor of a common dtype (so torch's weights-only unpickler is the judge of those).
    """
    path = Path(path)
    _check_size(path, limits)
    if path.suffix.lower() == ".pt":
        try:
            return _open_pt_mmap(path, limits)
        except TensorTooLargeError:
            raise
        except _NotPlainTensor as why:
            logger.debug("%s: fast reader declined (%s); using torch.load(weights_only=True)", path, why)
        except Exception as exc:  # noqa: BLE001 - any surprise: torch's weights-only loader judges the file
            logger.debug("%s: fast reader failed (%s); using torch.load(weights_only=True)", path, exc)
    return RawTensor(load_tensor(path, limits=limits))
