"""Tensor leaves of dump.json (dump-format.md §4.3) with statistics that stay on the device until a flush.

Each tensor costs small reductions computed where it lives (any device); their 0-d results are kept, grouped
by (device, dtype). :meth:`StatsBuffer.resolve` stacks each group once, joins a device's groups into one
float64 vector and moves it to the host (one copy and one wait per device, see
:func:`parity.client.devices.to_host`), then fills the ``Max``/``Min``/``Mean``/``Norm`` slots of the leaf
dicts in place (the slots exist from the start, so the key order of the file is msprobe's). Never one
``.item()`` per tensor, and no mix of devices (AdamW's CPU ``step`` counters beside CUDA weights) or dtypes
in one flush can fail it. A tensor whose values cannot be read (``meta``, fake, functional) keeps its dtype
and shape with null statistics (as msprobe writes it) and a ``note`` naming the reason (a key msprobe's and
Parity's readers ignore), logged once: never a crash.
Callers run this with torch-function handling disabled and grad off (see ``quiet()``), so the tool's own
reductions are neither recorded nor part of any autograd graph.

The Mean and Norm never overflow where the values do not (``_mean_norm``): a float32 attention score
masked with float32's minimum has a Mean of about -3.4e38 and a Norm above float32's range, which a float32
reduction writes as ``-inf``/``inf`` (and the replay then reads as a tensor overwritten since). On an
accelerator they are accumulated in float64 (float32 on MPS), which a memory-bound reduction gets for
nothing; on the CPU, where a float64 sum costs five times a float32 one, in the tensor's dtype as msprobe
8.3.3 does (so the two tools' dumps of the same CPU code agree bit for bit), and again in float64 where that
overflowed. Max and Min are exact in the tensor's own dtype.

The output of one call is usually the input of the next, and at mix a module's inputs and outputs are its
APIs' tensors: a small cache keyed by tensor identity *and* ``_version`` (bumped by every in-place update)
lets those leaves share one set of statistics instead of recomputing them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import weakref
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from parity.client.devices import host_dtype, synchronize, to_host, unreadable
from parity.client.dtensors import DTENSOR_TYPE, is_dtensor, layout_keys, local_tensor
from parity.client.xor_checksum import XorChecksums

__all__ = ["StatsBuffer", "crc32_hex", "grad_off", "quiet"]

log = logging.getLogger(__name__)

_FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
_SKIP_DTYPES = {getattr(torch, n) for n in _FP8
                if hasattr(torch, n)}  # fmt: skip
#: dtypes whose scalar's value is read as a Python number (no quantized, complex or fp8 dtype)
_PLAIN_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
                 torch.int16, torch.int32, torch.int64, torch.bool}  # fmt: skip
#: dtype -> (its name in dump.json, floating point, no statistics, a plain number): read per dtype once, not
#: per tensor
_DTYPES: dict[torch.dtype, tuple[str, bool, bool, bool]] = {}


def _dtype_info(dtype: torch.dtype) -> tuple[str, bool, bool, bool]:
    info = _DTYPES[dtype] = (str(dtype), dtype.is_floating_point, dtype in _SKIP_DTYPES,
                             dtype in _PLAIN_DTYPES)  # fmt: skip
    return info


_is_grad_enabled = torch._C.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
# torch's own guard (C++): ALL_DISABLED on enter, the previous state back on exit (nesting safe). Making one
# is cheaper than reading the state (``_get_torch_function_state`` builds an enum object, ~0.5 us) and
# setting it twice: the recorder does this several hundred times a step.
_DisableTorchFunction = torch._C.DisableTorchFunction


class _GradOff:
    """``torch.no_grad()`` without its per-use Python overhead (a decorator-capable class, several calls):
    the recorder enters one or two of these per recorded call."""

    __slots__ = ("_prev",)

    def __enter__(self) -> None:
        self._prev = _is_grad_enabled()
        _set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        _set_grad_enabled(self._prev)


class _Quiet:
    """Torch-function handling off (modes and subclasses) and grad off, both restored on exit. Grad is set
    only where it is on: in a backward hook (most of the recorder's calls at L0) it already is off."""

    __slots__ = ("_grad", "_tf")

    def __enter__(self) -> None:
        self._tf = tf = _DisableTorchFunction()
        tf.__enter__()
        self._grad = grad = _is_grad_enabled()
        if grad:
            _set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        if self._grad:
            _set_grad_enabled(True)
        self._tf.__exit__(None, None, None)


def grad_off() -> _GradOff:
    """Grad off for the tool's own tensor work (cheaper than ``torch.no_grad()``)."""
    return _GradOff()


def quiet() -> contextlib.AbstractContextManager[None]:
    """Run the tool's own torch calls unseen by any torch-function mode (ours included) and without grad.

    Where grad is already off (a backward hook: most of the recorder's calls at L0) torch's own guard does
    it all, with no Python frame to enter and leave."""
    return _Quiet() if _is_grad_enabled() else _DisableTorchFunction()


def crc32_hex(t: torch.Tensor) -> str:
    """msprobe's ``md5`` field: CRC-32 of the contiguous raw bytes as 8 lowercase hex digits (bf16 raw)."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    nbytes = flat.numel() * flat.element_size()
    # The bytes read in place through a ctypes buffer (zero-copy, held alive by ``flat``), not through
    # ``.numpy()``: a numpy view marks the storage as not resizable for good, and FSDP frees a parameter's
    # gathered storage by resizing it to 0 ("Trying to resize storage that is not resizable").
    data = (ctypes.c_char * nbytes).from_address(flat.data_ptr()) if nbytes else b""
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def _type_name(t: torch.Tensor) -> str:
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return "torch.Tensor"
    return f"{cls.__module__}.{cls.__name__}"


_Tensor = torch.Tensor
_EMPTY = torch.empty(0)
#: ``stage(tensor, consume)``: ``consume(a host copy of tensor)`` later, on the writer thread, in order
Stage = Callable[[torch.Tensor, Callable[[torch.Tensor], object]], None]
#: an md5 now, or a one-slot box the writer thread fills
_Digest = str | list[str | None]
_Parameter = torch.nn.Parameter
_STRIDED = torch.strided
_is_functional = torch._is_functional_tensor
_noted: set[str] = set()  # reasons already logged in this process


def note_unreadable(reason: str, where: str) -> None:
    """Log once per reason that statistics were left null (the leaf keeps its dtype and shape)."""
    if reason not in _noted:
        _noted.add(reason)
        log.warning("parity: %s (%s): dtype and shape recorded, statistics left null", where, reason)


#: (device, kind, the computation of a group's statistics, per tensor the leaves sharing them)
_Pending = tuple[torch.device, int, Callable[[], torch.Tensor], list[list[dict[str, Any]]]]
#: (tensor, version, the leaves it feeds, md5 or its box, shape)
_Cached = tuple[torch.Tensor, int, list[dict[str, Any]], _Digest | None, torch.Size]
#: (device, stat dtype, kind, shape) of small tensors copied for their statistics
_StagedKey = tuple[torch.device, torch.dtype, int, torch.Size]
#: the copies of one _StagedKey, and per copy the leaves sharing its statistics
_Staged = tuple[list[torch.Tensor], list[list[dict[str, Any]]]]
#: a tensor whose statistics wait (StatsBuffer.later): the tensor, its _StagedKey, its leaf
Later = tuple[torch.Tensor, _StagedKey, dict[str, Any]]
# id(parameter) -> (a weak reference to it, its data_ptr and shape when seen, its leaf but requires_grad, its
# _StagedKey): what StatsBuffer.later checks once per parameter, not at every forward
_PARAMS: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Size, dict[str, Any], _StagedKey]] = {}
_MAX_PARAMS = 1 << 20
#: (stacked chunks of statistics, 0-d statistics not stacked yet, per tensor the leaves sharing them)
_Group = tuple[list[torch.Tensor], list[torch.Tensor], list[list[dict[str, Any]]]]


class StatsBuffer:
    """Builds tensor leaves now and fills their statistics at :meth:`resolve`."""

    #: Resolve early past this many pending tensors, so a long step does not pile up device memory.
    MAX_PENDING = 20000

    #: 0-d statistics stacked into one tensor as they come: each live tensor object is one more for the
    #: garbage collector to walk, and a stack of 256 costs about one reduction
    CHUNK = 256

    #: A contiguous tensor of at most this many elements is copied (one dispatch) instead of reduced (three):
    #: at :meth:`resolve`, the copies of one (device, dtype, shape) are stacked and reduced row by row, four
    #: kernels for all of them. Each row is reduced exactly as the tensor alone would be (same kernels, same
    #: summation order, bit for bit: below torch's 32768-element grain a CPU reduction is never split
    #: across threads); larger tensors keep their own reductions (a copy would cost memory bandwidth).
    SMALL = 32768

    #: Resolve early past this many staged elements (their copies are held until then).
    MAX_STAGED = 16 << 20

    #: How many recent tensors the identity cache remembers (it holds references, so keep it small).
    CACHE_SIZE = 64

    def __init__(self, *, md5: bool, stage: Stage | None = None, stage_cpu: bool = False,
                 fill_later: Callable[[Callable[[], object]], None] | None = None, xor: bool = False,
                 ) -> None:  # fmt: skip
        self.md5 = md5
        # summary_mode "xor": msprobe 26's checksum instead of the statistics (client/xor_checksum.py)
        self.xor = XorChecksums() if xor else None
        # ``fill_later(job)``: run ``job`` later, in order with what reads the leaves (the writer thread: its
        # next job writes the documents): the leaves get their numbers (a Python loop over every leaf) and
        # the staged copies are freed there, off the training thread; None: at once, in :meth:`resolve`
        self._fill_later = fill_later
        # md5 of a tensor off the CPU: ``stage(tensor, consume)`` runs ``consume(host copy)`` on the writer
        # thread (BackgroundWriter.submit_host), so the training thread never waits for a copy per tensor;
        # ``stage_cpu``: CPU tensors too (the tests' stand-in for an accelerator)
        self._stage = stage
        self._stage_cpu = stage_cpu
        # (device, stat dtype, kind) -> its statistics (4 per float tensor, 2 per bool tensor, 1 per 0-d
        # tensor), and per tensor the leaves that share them
        self._groups: dict[tuple[torch.device, torch.dtype, int], _Group] = {}
        # (device, stat dtype, kind, shape) -> the copies of small tensors, and per copy the leaves sharing it
        self._staged: dict[_StagedKey, _Staged] = {}
        # the same, as stacked blocks of several tensors (take_later)
        self._blocks: dict[_StagedKey, _Staged] = {}
        # copies of small CPU tensors that are not contiguous, with their strides, and the leaves sharing each
        self._strided: list[tuple[torch.Tensor, list[dict[str, Any]]]] = []
        self._staged_numel = 0
        # id(tensor) -> see _Cached; holding the tensor keeps its id unique
        self._cache: dict[int, _Cached] = {}
        self.pending = 0
        self.unreadable = 0  # leaves left null because their values could not be read

    def leaf(self, t: torch.Tensor, data_name: str | None = None,
             layout: tuple[bool, dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
        """The leaf dict of ``t``; statistics are queued, filled by the next :meth:`resolve`.

        The same tensor object at the same version (a call's output, the next call's input) gets the same
        leaf dict back, written wherever it is recorded: its values are those of that one leaf (type, dtype,
        shape and requires_grad checked; a leaf naming a tensor file is never shared). A DTensor's leaf holds
        its local shard's statistics and its layout (:mod:`parity.client.dtensors`); ``layout`` is that
        DTensor's ``requires_grad`` and layout keys, given when ``t`` is its local shard."""
        # Every attribute of ``t`` is read once (each read is a call into torch): this runs for every tensor
        # recorded, a few thousand times a step.
        cls = type(t)
        plain = cls is _Tensor or cls is _Parameter
        if not plain and layout is None and is_dtensor(t):
            return self.leaf(local_tensor(t), data_name, (t.requires_grad, layout_keys(t)))
        if self.xor is not None:
            return self._xor_leaf(t, data_name)
        version = t._version
        shape = t.shape
        cache = self._cache
        hit = cache.get(id(t))
        if hit is not None:
            if hit[0] is not t or hit[1] != version:
                hit = None  # another tensor at a reused address, or this one changed in place since
            elif data_name is None and layout is None and hit[4] == shape:
                first = hit[2][0]
                if first["requires_grad"] is t.requires_grad and "data_name" not in first:
                    return first  # (a planned dump: a leaf naming a file for one call is never shared)
        dtype = t.dtype
        info = _DTYPES.get(dtype) or _dtype_info(dtype)
        leaf: dict[str, Any] = {
            "type": "torch.Tensor" if plain else _type_name(t), "dtype": info[0], "shape": list(shape),
            "Max": None, "Min": None, "Mean": None, "Norm": None, "requires_grad": t.requires_grad,
        }  # fmt: skip
        if layout is not None:  # a DTensor's local shard: msprobe's type, the DTensor's requires_grad
            leaf["type"] = DTENSOR_TYPE
            leaf["requires_grad"] = layout[0]
            leaf.update(layout[1])
        if data_name is not None:
            leaf["data_name"] = data_name
        if hit is not None:  # the same tensor object at the same version, readable and non-empty when cached
            hit[2].append(leaf)
            if hit[3] is not None:
                self._set_md5(leaf, hit[3])
            return leaf
        if not plain or t.is_meta or _is_functional(t):
            reason = unreadable(t)
            if reason is not None:
                self.unreadable += 1
                leaf["note"] = f"{reason}: values not readable, statistics null"
                note_unreadable(reason, f"a {info[0]} tensor of shape {list(shape)}")
                return leaf
        numel = t.numel()
        if numel == 0 or info[2] or t.layout is not _STRIDED:
            if self.md5 and t.layout is _STRIDED:
                leaf["md5"] = crc32_hex(t)
            return leaf
        sharing = [leaf]
        try:
            if not shape and info[3] and plain and t.is_cpu:
                return self._scalar_leaf(t, leaf)
            if numel <= self.SMALL and shape and plain and t.is_contiguous():  # not 0-d
                if info[1] and dtype is not torch.float64:
                    kind = _FULL
                    copy = t.clone()
                    copy_dtype = dtype
                else:
                    kind, copy = _staged_copy(t)
                    copy_dtype = copy.dtype
                skey = (t.device, copy_dtype, kind, shape)
                staged = self._staged.get(skey)
                if staged is None:
                    staged = self._staged[skey] = ([], [])
                staged[0].append(copy)
                staged[1].append(sharing)
                self._staged_numel += numel
            elif (numel <= self.SMALL and shape and plain and t.is_cpu
                  and (strided := _strided_copy(t)) is not None):  # fmt: skip
                # a small view (a slice, a transpose): its reductions would each set up a strided walk of
                # its values here; a copy with its strides costs one, and its reductions, run at the flush,
                # walk the same values in the same order as the tensor's own
                self._strided.append((strided, sharing))
                self._staged_numel += numel
            else:
                kind, vals = _reductions(t)
                key = (t.device, vals[0].dtype, kind)
                group = self._groups.get(key)
                if group is None:
                    group = self._groups[key] = ([], [], [])
                pending = group[1]
                pending.extend(vals)
                if len(pending) >= self.CHUNK:  # one tensor instead of CHUNK: fewer objects for the collector
                    group[0].append(torch.stack(pending))
                    pending.clear()
                group[2].append(sharing)
            digest = self._md5(t) if self.md5 else None
        except Exception as exc:  # a tensor subclass that cannot run the reductions: never fail the step
            self.unreadable += 1
            note_unreadable(f"{type(exc).__name__}: {exc}"[:200], f"a {type(t).__name__} of dtype {info[0]}")
            return leaf
        if digest is not None:
            self._set_md5(leaf, digest)
        if len(cache) >= self.CACHE_SIZE:  # started over (what is shared is a call's output and the next
            cache.clear()  # call's input: recent tensors), cheaper than dropping the oldest one by one
        if layout is None:  # a DTensor's leaf is never handed back for its local shard
            cache[id(t)] = (t, version, sharing, digest, shape)
        self.pending = pending_now = self.pending + 1
        if pending_now >= self.MAX_PENDING or self._staged_numel >= self.MAX_STAGED:
            self.resolve(later=False)  # here and now: a long step never holds more than this many copies
        return leaf

    def unwritten(self, t: torch.Tensor, what: str) -> dict[str, Any]:
        """The leaf of a tensor whose memory holds no value yet (``torch.empty``'s output, a collective's
        output buffer before the call): its dtype, shape and layout, null statistics (what a compare
        passes on both sides), and a ``note`` saying ``what`` it is. Reading it would record whatever the
        allocator left there, different from run to run."""
        layout = None
        if type(t) is not _Tensor and type(t) is not _Parameter and is_dtensor(t):
            layout = (t.requires_grad, layout_keys(t))
            t = local_tensor(t)
        leaf: dict[str, Any] = {
            "type": _type_name(t) if layout is None else DTENSOR_TYPE, "dtype": str(t.dtype),
            "shape": list(t.shape), "Max": None, "Min": None, "Mean": None, "Norm": None,
            "requires_grad": t.requires_grad if layout is None else layout[0],
        }  # fmt: skip
        if layout is not None:
            leaf.update(layout[1])
        if self.md5:
            leaf["md5"] = None
        leaf["note"] = f"{what}: uninitialised memory, values not recorded"
        return leaf

    def _xor_leaf(self, t: torch.Tensor, data_name: str | None) -> dict[str, Any]:
        """msprobe 26's xor leaf (no statistics; ``md5`` filled at :meth:`resolve`)."""
        info = _DTYPES.get(t.dtype) or _dtype_info(t.dtype)
        plain = type(t) is _Tensor or type(t) is _Parameter
        leaf: dict[str, Any] = {
            "type": "torch.Tensor" if plain else _type_name(t), "dtype": info[0], "shape": list(t.shape),
            "md5": None, "requires_grad": t.requires_grad,
        }  # fmt: skip
        if data_name is not None:
            leaf["data_name"] = data_name
        reason = unreadable(t) if not plain or t.is_meta or _is_functional(t) else None
        if reason is not None:
            self.unreadable += 1
            note_unreadable(reason, f"a {info[0]} tensor of shape {list(t.shape)}")
            return leaf
        assert self.xor is not None
        if t.is_cpu:
            # a call's output is the next call's input: the same tensor at the same version has the same
            # checksum, computed once (on the CPU it is known at once)
            hit = self._cache.get(id(t))
            if hit is not None and hit[0] is t and hit[1] == t._version and hit[3] is not None:
                leaf["md5"] = hit[3]
                return leaf
            self.xor.add(t, leaf)
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            self._cache[id(t)] = (t, t._version, [], leaf["md5"], t.shape)
            return leaf
        self.xor.add(t, leaf)
        if self.xor.pending >= self.MAX_PENDING:
            self.xor.resolve()
        return leaf

    def later(self, t: torch.Tensor) -> Later | None:
        """The leaf of ``t`` with its statistics left to :meth:`take_later`, or None where ``t`` is not a
        tensor that path takes (the caller uses :meth:`leaf`).

        For a tensor whose values do not change until a known point (a parameter until its forward is over,
        its gradient until the backward that accumulated it ends): no copy now, one ``stack`` per shape
        then, for all of them. Only what :meth:`leaf` would stage as a copy qualifies (plain, small,
        contiguous, floating point, no md5), so the statistics are the same, bit for bit. A parameter's
        checks are kept for the process, keyed by its storage and shape (``.data =`` and ``.to()``
        change the storage)."""
        if self.md5 or self.xor is not None:
            return None
        cls = type(t)
        if cls is _Parameter:
            known = _PARAMS.get(id(t))
            if known is not None and known[0]() is t and known[1] == t.data_ptr() and known[2] == t.shape:
                leaf = known[3].copy()
                leaf["requires_grad"] = t.requires_grad
                return t, known[4], leaf
        elif cls is not _Tensor:
            return None
        if t.layout is not _STRIDED or t.is_meta or _is_functional(t):
            return None
        dtype = t.dtype
        info = _DTYPES.get(dtype) or _dtype_info(dtype)
        shape = t.shape
        if not (info[1] and not info[2] and dtype is not torch.float64 and shape
                and 0 < t.numel() <= self.SMALL and t.is_contiguous()):  # fmt: skip
            return None  # (float64: its statistics are computed in float32, from a copy)
        leaf = {"type": "torch.Tensor", "dtype": info[0], "shape": list(shape), "Max": None, "Min": None,
                "Mean": None, "Norm": None, "requires_grad": t.requires_grad}  # fmt: skip
        key = (t.device, dtype, _FULL, shape)
        if cls is _Parameter:
            if len(_PARAMS) > _MAX_PARAMS:
                _PARAMS.clear()
            _PARAMS[id(t)] = (weakref.ref(t), t.data_ptr(), shape, dict(leaf), key)
        return t, key, leaf

    def later_grad(self, grad: torch.Tensor, param: torch.Tensor) -> Later | None:
        """:meth:`later` for ``param``'s gradient: by torch's layout contract a gradient has its parameter's
        dtype, shape, device and layout, so the parameter's cached checks serve once these few match (else
        the gradient is looked at as any tensor)."""
        known = _PARAMS.get(id(param))
        if (known is None or self.md5 or self.xor is not None or type(grad) is not _Tensor
                or grad.layout is not _STRIDED or known[0]() is not param):  # fmt: skip
            return self.later(grad)
        key = known[4]
        if (grad.dtype is not key[1] or grad.shape != known[2] or not grad.is_contiguous()
                or grad.device != key[0]):  # fmt: skip
            return self.later(grad)
        leaf = known[3].copy()
        leaf["requires_grad"] = grad.requires_grad
        return grad, key, leaf

    def take_later(self, pending: list[Later]) -> None:
        """The statistics of the tensors given :meth:`later` leaves, as they are now: one stacked copy per
        (device, dtype, shape), reduced row by row at :meth:`resolve` like the copies :meth:`leaf` stages."""
        by_key: dict[_StagedKey, _Staged] = {}
        for t, key, leaf in pending:
            if not _storage_alive(t):  # freed since (resize_(0), as FSDP does): reading it would crash
                self.unreadable += 1
                reason = "storage freed before its statistics were read"
                leaf["note"] = f"{reason}: values not readable"
                note_unreadable(reason, f"a tensor of shape {leaf['shape']}")
                continue
            group = by_key.get(key)
            if group is None:
                group = by_key[key] = ([], [])
            group[0].append(t)
            group[1].append([leaf])
        with quiet():
            for key, (tensors, leaves) in by_key.items():
                block = self._blocks.get(key)
                if block is None:
                    block = self._blocks[key] = ([], [])
                block[0].append(torch.stack(tensors))
                block[1].extend(leaves)
                self._staged_numel += len(tensors) * tensors[0].numel()
        self.pending += len(pending)

    def _scalar_leaf(self, t: torch.Tensor, leaf: dict[str, Any]) -> dict[str, Any]:
        """A CPU scalar (AdamW's step counts, a loss, a clamp bound...): its value, read now, is all four
        statistics (the norm too, sign included, as msprobe writes it; any and all for a bool), the numbers
        the flush would give it (its float64 value), with no copy to stage. A CPU tensor's value is read
        without waiting for any device."""
        value = t.item()
        if type(value) is bool:
            leaf["Max"] = leaf["Min"] = value
        else:
            leaf["Max"] = leaf["Min"] = leaf["Mean"] = leaf["Norm"] = float(value)
        if self.md5:
            self._set_md5(leaf, self._md5(t))
        return leaf

    def _md5(self, t: torch.Tensor) -> _Digest:
        """The CRC now (a CPU tensor: zero-copy), or a box the writer thread fills from a host copy."""
        if self._stage is None or (t.device.type == "cpu" and not self._stage_cpu):
            return crc32_hex(t)
        box: list[str | None] = [None]

        def consume(host: torch.Tensor) -> None:
            box[0] = crc32_hex(host)

        self._stage(t, consume)
        return box

    def _set_md5(self, leaf: dict[str, Any], digest: _Digest) -> None:
        if isinstance(digest, str):
            leaf["md5"] = digest
            return
        # the key now (msprobe's key order), the value once the writer thread has the CRC: queued after the
        # copy's job, and before any flush's documents (the writer runs its jobs in order)
        leaf["md5"] = None
        if self._stage is not None:
            self._stage(_EMPTY, lambda _: leaf.__setitem__("md5", digest[0]))

    def forget(self) -> None:
        """Drop the identity cache: for writes that do not bump ``_version`` (collectives write in C++)."""
        self._cache.clear()

    def resolve(self, *, later: bool = True) -> None:
        """Take every pending statistic; reduce the staged copies, move the statistics to the host (one copy
        per device) and fill the leaves: now, or in a ``fill_later`` job (off the training thread: a reader of
        the leaves then waits for that job, as the documents' writer does); ``later=False``: now in any case.
        """
        if self.xor is not None:
            self.xor.resolve()
        # statistics may have been queued on any stream of their device (the user's side streams): wait for
        # the whole device once, so that any stream (and thread) may read them
        devices = {key[0] for key in self._groups} | {key[0] for key in self._staged}
        for device in devices | {key[0] for key in self._blocks}:
            with contextlib.suppress(Exception):
                synchronize(device)
        # the groups as they are: making their computations (a Python loop over every shape) is left to
        # _finish, off the training thread when it runs later
        taken = self._groups, self._staged, self._strided, self._blocks
        self._groups = {}
        self._staged = {}
        self._blocks = {}
        self._strided = []
        self._staged_numel = 0
        self._cache.clear()
        self.pending = 0
        if self._fill_later is None or not later:
            self._finish(*taken)
        else:
            self._fill_later(partial(self._finish, *taken))

    def _finish(self, reduced: dict[tuple[torch.device, torch.dtype, int], _Group],
                staged: dict[_StagedKey, _Staged],
                strided: list[tuple[torch.Tensor, list[dict[str, Any]]]],
                blocks: dict[_StagedKey, _Staged]) -> None:  # fmt: skip
        """Compute each group's statistics, bring them to the host and fill the leaves (the copies held by
        the groups are released after the devices were waited for: no stream still reads them)."""
        with quiet():
            for copy, sharing in strided:  # the reductions its tensor would have had when recorded
                try:
                    kind, vals = _reductions(copy)
                except Exception as exc:
                    self.unreadable += 1
                    note_unreadable(f"{type(exc).__name__}: {exc}"[:200], f"a {copy.dtype} view")
                    continue
                group = reduced.setdefault((copy.device, vals[0].dtype, kind), ([], [], []))
                group[1].extend(vals)
                group[2].append(sharing)
        groups: list[_Pending] = [
            (device, kind, partial(_stack_chunks, chunks, pending), leaves)
            for (device, _, kind), (chunks, pending, leaves) in reduced.items()
        ]
        groups += [(device, kind, partial(_row_statistics, kind, copies), leaves)
                   for (device, _, kind, _), (copies, leaves) in staged.items()]  # fmt: skip
        groups += [(device, kind, partial(_row_statistics, kind, stacked, blocks=True), leaves)
                   for (device, _, kind, _), (stacked, leaves) in blocks.items()]  # fmt: skip
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        # per device: (offset into its host vector, kind, leaves) of each group
        layout: dict[torch.device, list[tuple[int, int, list[list[dict[str, Any]]]]]] = {}
        with quiet():
            for device, kind, compute, leaves in groups:
                try:
                    stacked = compute().to(host_dtype(device))
                except Exception as exc:  # an exotic device or subclass: these leaves keep null statistics
                    self.unreadable += len(leaves)
                    note_unreadable(f"{type(exc).__name__}: {exc}"[:200], f"statistics on {device}")
                    continue
                parts = by_device.setdefault(device, [])
                offset = sum(p.numel() for p in parts)
                parts.append(stacked)
                layout.setdefault(device, []).append((offset, kind, leaves))
            try:  # every device's copy queued, then each waited for: transfers of several devices overlap
                hosts = to_host(by_device)
            except Exception:  # one device failing must not cost the others their statistics
                hosts = {}
                for device, parts in by_device.items():
                    try:
                        hosts.update(to_host({device: parts}))
                    except Exception as exc:
                        note_unreadable(f"{type(exc).__name__}: {exc}"[:200], f"statistics on {device}")
        for device, flat in hosts.items():
            host = flat.tolist()
            for offset, kind, leaves in layout[device]:
                _fill(host, offset, kind, leaves)


#: What one tensor contributes to its group: max, min, mean, norm; any, all (bool); one value (0-d).
_FULL, _BOOL, _SCALAR = 4, 2, 1


def _reductions(x: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    """The 0-d statistics of ``x`` where it lives, and their kind.

    A 0-d tensor costs one copy: msprobe writes its value as all four statistics (the norm too, sign
    included); any other tensor two or three reductions. No detach(): callers run under quiet() (no grad),
    so it would only cost a dispatch."""
    if x.dtype is torch.bool:
        if x.dim() == 0:
            return _SCALAR, [x.clone()]
        return _BOOL, [x.any(), x.all()]
    if x.is_complex():
        x = x.abs()
    elif x.dim() == 0:
        # the value, as msprobe writes it (an integer's exactly: float64, float32 where the device has none)
        if not x.is_floating_point():
            return _SCALAR, [x.double() if x.device.type != "mps" else x.float()]  # already a copy
    elif not x.is_floating_point() or x.dtype is torch.float64:
        x = x.float()  # msprobe 8.3.3's statistics of integers and float64: computed in float32
    if x.dim() == 0:
        return _SCALAR, [x.clone()]
    mn, mx = torch.aminmax(x)
    return _FULL, [mx, mn, *_mean_norm(x, mx, mn)]


def _mean_norm(x: torch.Tensor, mx: torch.Tensor, mn: torch.Tensor,
               dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The Mean and Norm of ``x`` (over ``dim``, the rows of a stack of copies, or all of it), accumulated
    without overflow (module docstring); ``mx``/``mn``: its Max and Min, the same way."""
    over: dict[str, Any] = {} if dim is None else {"dim": dim}
    if not x.is_cpu:
        wide = host_dtype(x.device)
        return x.mean(dtype=wide, **over), torch.linalg.vector_norm(x, dtype=wide, **over)
    mean, norm = x.mean(**over), torch.linalg.vector_norm(x, **over)
    # a CPU tensor's values are at hand: no device to wait for
    overflow = ~(torch.isfinite(mean) & torch.isfinite(norm)) & torch.isfinite(mx) & torch.isfinite(mn)
    if not bool(overflow.any()):
        return mean, norm
    f64 = torch.float64
    return (torch.where(overflow, x.mean(dtype=f64, **over), mean.double()),
            torch.where(overflow, torch.linalg.vector_norm(x, dtype=f64, **over), norm.double()))


def _storage_alive(t: torch.Tensor) -> bool:
    """Whether ``t``'s storage still holds its elements (a contiguous tensor's, as :meth:`StatsBuffer.later`
    takes): a storage resized to 0 since it was recorded is read past its end by ``stack``."""
    return t.untyped_storage().nbytes() >= (t.storage_offset() + t.numel()) * t.element_size()


def _strided_copy(x: torch.Tensor) -> torch.Tensor | None:
    """A copy of ``x`` with its sizes and strides (gaps included), or None where its elements overlap (an
    expanded tensor): reducing the copy walks the same values in the same order as reducing ``x``."""
    try:
        copy = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        copy.copy_(x)
    except RuntimeError:
        return None
    return copy


def _staged_copy(x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """A copy of a small contiguous ``x`` (not 0-d) in the dtype its statistics are computed in, and its kind:
    what :func:`_row_statistics` reduces at the flush (the values as they are now, whatever happens later)."""
    if x.dtype is torch.bool:
        return _BOOL, x.clone()
    if x.is_complex():
        return _FULL, x.abs()
    if not x.is_floating_point() or x.dtype is torch.float64:
        return _FULL, x.float()  # as msprobe 8.3.3 computes them (see _reductions)
    return _FULL, x.clone()


def _row_statistics(kind: int, copies: list[torch.Tensor], blocks: bool = False) -> torch.Tensor:
    """The statistics of same-shape copies, flat in :func:`_fill`'s order: one row each, four kernels in all
    (max, min, mean, norm; any and all for bool), the values :func:`_reductions` computes one by one.
    ``blocks``: the copies are stacks of several (``take_later``), joined rather than stacked."""
    joined = (copies[0] if len(copies) == 1 else torch.cat(copies)) if blocks else torch.stack(copies)
    rows = joined.view(joined.shape[0], -1)
    if kind == _BOOL:
        return torch.stack((rows.any(1), rows.all(1)), 1).view(-1)
    mx, mn = rows.amax(1), rows.amin(1)
    return torch.stack((mx, mn, *_mean_norm(rows, mx, mn, dim=1)), 1).view(-1)


def _stack_chunks(chunks: list[torch.Tensor], pending: list[torch.Tensor]) -> torch.Tensor:
    if pending:
        chunks.append(torch.stack(pending))
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def _fill(host: list[float], offset: int, kind: int, leaves: list[list[dict[str, Any]]]) -> None:
    if kind == _BOOL:
        for i, sharing in enumerate(leaves):
            j = offset + 2 * i
            anyv, allv = bool(host[j]), bool(host[j + 1])
            for leaf in sharing:
                leaf["Max"], leaf["Min"] = anyv, allv
    elif kind == _SCALAR:
        for i, sharing in enumerate(leaves):
            v = host[offset + i]
            for leaf in sharing:
                if leaf["dtype"] == "torch.bool":
                    leaf["Max"] = leaf["Min"] = bool(v)
                else:
                    leaf["Max"] = leaf["Min"] = leaf["Mean"] = leaf["Norm"] = v
    else:
        for i, sharing in enumerate(leaves):
            j = offset + 4 * i
            mx, mn, mean, norm = host[j : j + 4]
            for leaf in sharing:
                leaf["Max"], leaf["Min"], leaf["Mean"], leaf["Norm"] = mx, mn, mean, norm
