"""A tensor's ``.pt`` file: the bytes ``torch.save`` writes, at a fraction of its CPU cost.

A planned dump writes ~160 small tensor files a step on the writer thread, whose CPU time (and GIL) is
taken from training on a small host. Most of ``torch.save``'s time for a small tensor goes into pickling
the tensor (typed storages, a persistent-id call per pickled object), yet for a plain CPU tensor the
pickle depends only on its dtype, shape, strides, storage offset and storage size. :class:`TensorFiles`
runs torch's own serializer (``torch.serialization._save``) once per such layout, records the archive's
records in order, and for every later tensor of that layout replays them into torch's own zip writer
(``torch._C.PyTorchFileWriter``) with the new tensor's storage: the same records, in the same order,
through the same writer, so the file is the one ``torch.save`` writes, byte for byte (the tests check
this for every dtype).

For a small storage (up to :data:`TEMPLATE_MAX_BYTES`) even the replay is more than needed: a stored zip
archive of one layout differs from another of the same layout only in the storage's bytes, their CRC-32 and
the archive's serialization id (a hash of the records' CRCs). :class:`_Template` keeps the bytes before and
after the storage and where those go, learnt once per layout from two replays of different contents and
checked against the second one; a file is then
``head + storage + tail``, written with one ``writev`` and no copy of the storage, and its only work in
Python is a ``zlib.crc32`` (which leaves the GIL to training above 5 KiB) and a few patches of the tail. A
layout whose archives differ anywhere else keeps the replay. Anything else (a subclass, a tensor with Python
state, hooks, names, a quantized, sparse, conjugated or negated tensor, a torch without those internals) goes
through ``torch.save``.
"""

from __future__ import annotations

import ctypes
import io
import logging
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["TEMPLATE_MAX_BYTES", "TensorFiles"]

log = logging.getLogger(__name__)

_STORAGE = None  # in a recorded archive: where the tensor's storage goes
_Record = tuple[str, Any]  # (record name, its bytes or _STORAGE)
_Layout = tuple[Any, ...]
_Options = tuple[bool, int]
_Buffer = Any  # bytes, bytearray, memoryview or a ctypes array: what os.writev and zlib.crc32 take
_U32 = struct.Struct("<I")
_LOCAL_HEADER = b"PK\x03\x04"

#: storages up to this size are written from a byte template (larger ones: the per-file cost is the data's)
TEMPLATE_MAX_BYTES = 1 << 20


class _Records:
    """Stands in for torch's zip writer while ``torch.serialization._save`` runs: keeps its records."""

    def __init__(self) -> None:
        self.records: list[_Record] = []

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if isinstance(data, (bytes, str)):
            self.records.append((name, data))
        elif name == "data/0" and isinstance(data, torch.UntypedStorage):
            self.records.append((name, _STORAGE))
        else:  # a second storage, or a record of a kind not known here: not replayable
            raise _NotReplayable(name)

    def write_record_metadata(self, name: str, nbytes: int) -> None:
        raise _NotReplayable(name)


class _NotReplayable(Exception):
    pass


class _Template:
    """One layout's archive around its storage: ``head``, the storage's bytes, ``tail``.

    What changes with the storage's bytes: their CRC-32 (little-endian, at ``crcs`` in head + storage +
    tail, storage excluded: ``head_crcs`` and ``tail_crcs``) and, where torch writes one, the archive's
    ``.data/serialization_id``: 20 digits of a record-name hash, then 20 of a hash of every record's CRC
    (``c10::hash_combine`` in write order), so its digits (at ``id_at`` in the tail) and its own CRC (at
    ``id_crcs``) follow the storage's CRC."""

    __slots__ = ("head", "head_crcs", "id_at", "id_crcs", "id_seed", "id_after", "tail", "tail_crcs")

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail
        self.head_crcs: tuple[int, ...] = ()
        self.tail_crcs: tuple[int, ...] = ()
        self.id_at = -1  # the id's CRC digits in the tail (-1: no id to follow)
        self.id_crcs: tuple[int, ...] = ()
        self.id_seed = 0  # the CRC hash of the records before the storage's
        self.id_after: tuple[int, ...] = ()  # the CRCs of the records after it, up to the id

    def parts(self, data: _Buffer) -> list[_Buffer]:
        """The file of a storage whose bytes are ``data``, as three buffers (``data`` itself not copied)."""
        crc = zlib.crc32(data)
        head: _Buffer = self.head
        if self.head_crcs:
            head = bytearray(head)
            for at in self.head_crcs:
                _U32.pack_into(head, at, crc)
        tail = bytearray(self.tail)
        for at in self.tail_crcs:
            _U32.pack_into(tail, at, crc)
        at = self.id_at
        if at >= 0:
            combined = _hash_combine(self.id_seed, crc)
            for other in self.id_after:
                combined = _hash_combine(combined, other)
            tail[at : at + 20] = b"%020d" % combined
            id_crc = zlib.crc32(memoryview(tail)[at - 20 : at + 20])
            for at in self.id_crcs:
                _U32.pack_into(tail, at, id_crc)
        return [head, data, tail]

    @classmethod
    def learn(cls, write: Callable[[Any], bytes], nbytes: int) -> _Template | None:
        """The template of the archives ``write(storage)`` makes, or None where they do not fit one.

        Two archives, of an all-zero storage and of an all-0xA5 one: the storage and the id sit where the
        zip's local headers say; a CRC field is where the first archive holds the zero storage's (or id's)
        CRC and the second the other's. The second archive must come out of the template exactly."""
        zeros, other = bytes(nbytes), b"\xa5" * nbytes
        first, second = write(_storage_of(zeros)), write(_storage_of(other))
        records = _records_in(first)
        if len(first) != len(second) or records is None or not nbytes:  # nbytes 0: one archive, no patch
            return cls(first, b"") if records is not None and first == second else None
        names = [name for name, _, _ in records]
        data = [i for i, name in enumerate(names) if name.endswith("/data/0")]
        if len(data) != 1 or records[data[0]][1] is None:
            return None
        start = records[data[0]][1] or 0
        end = start + nbytes
        if first[start:end] != zeros:
            return None
        template = cls(first[:start], first[end:])
        skip = [(start, end)]
        ids = [i for i, name in enumerate(names) if name.endswith("/.data/serialization_id")]
        if ids:
            (k,) = ids
            id_start = records[k][1]
            if id_start is None or id_start < end or k < data[0]:
                return None
            skip.append((id_start, id_start + 40))
            template.id_at = id_start + 20 - end
            first_id, second_id = first[id_start : id_start + 40], second[id_start : id_start + 40]
            template.id_crcs = tuple(at - end for at in _fields(first, second, first_id, second_id, skip))
            crcs = [crc for _, _, crc in records]
            for crc in crcs[: data[0]]:
                template.id_seed = _hash_combine(template.id_seed, crc)
            template.id_after = tuple(c for i, c in enumerate(crcs) if data[0] < i and i != k)
        crcs_at = _fields(first, second, zeros, other, skip)
        template.head_crcs = tuple(at for at in crcs_at if at < start)
        template.tail_crcs = tuple(at - end for at in crcs_at if at >= end)
        return template if b"".join(template.parts(other)) == second else None


_U64 = (1 << 64) - 1


def _hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine`` on 64-bit ``size_t``."""
    return seed ^ ((value + 0x9E3779B9 + ((seed << 6) & _U64) + (seed >> 2)) & _U64)


def _fields(first: bytes, second: bytes, a: bytes, b: bytes, skip: list[tuple[int, int]]) -> list[int]:
    """Offsets where ``first`` holds the CRC-32 of ``a`` and ``second`` that of ``b`` (outside ``skip``)."""
    crc_a, crc_b = _U32.pack(zlib.crc32(a)), _U32.pack(zlib.crc32(b))
    found: list[int] = []
    if crc_a == crc_b:
        return found
    at = first.find(crc_a)
    while at >= 0:
        inside = any(lo - 4 < at < hi for lo, hi in skip)
        if not inside and second[at : at + 4] == crc_b:
            found.append(at)
        at = first.find(crc_a, at + 1)
    return found


def _records_in(archive: bytes) -> list[tuple[str, int | None, int]] | None:
    """The archive's records in order: name, where its bytes start (None: not found), CRC-32 (the central
    directory's); None if it is no zip this code reads."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            infos = sorted(zf.infolist(), key=lambda i: i.header_offset)
    except (zipfile.BadZipFile, ValueError):
        return None
    out: list[tuple[str, int | None, int]] = []
    for info in infos:
        at = info.header_offset
        start = None
        if archive[at : at + 4] == _LOCAL_HEADER:
            name_len, extra_len = struct.unpack_from("<HH", archive, at + 26)
            start = at + 30 + name_len + extra_len
        out.append((info.filename, start, info.CRC))
    return out


def _storage_of(data: bytes) -> Any:
    """An untyped storage holding ``data``."""
    if not data:
        return torch.UntypedStorage(0)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone().untyped_storage()


def storage_bytes(tensor: torch.Tensor) -> _Buffer:
    """The bytes of ``tensor``'s (CPU) storage, without a copy: valid while ``tensor`` lives."""
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if not nbytes:
        return b""
    return (ctypes.c_char * nbytes).from_address(storage.data_ptr())


class TensorFiles:
    """Serializes tensors to ``torch.save``'s bytes; one instance per thread (its cache is not locked)."""

    def __init__(self) -> None:
        self._archives: dict[_Layout, list[_Record] | None] = {}  # None: this layout goes to torch.save
        self._templates: dict[_Layout, _Template | None] = {}  # None: this layout is replayed
        self._replay = hasattr(torch._C, "PyTorchFileWriter") and hasattr(torch.serialization, "_save")

    def encode(self, tensor: torch.Tensor) -> bytes | memoryview:
        """The bytes ``torch.save(tensor, f)`` writes to a file object ``f``."""
        parts = self.parts(tensor)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @staticmethod
    def options() -> _Options:
        """torch.save's settings that shape the archive (CRC-32 on, storage alignment): read once for a
        batch of files, since reading them costs more than a small file's template."""
        return torch.serialization.get_crc32_options(), torch.serialization._get_storage_alignment()

    def parts(self, tensor: torch.Tensor, options: _Options | None = None) -> Sequence[_Buffer]:
        """:meth:`encode`'s bytes as buffers to write in order (``os.writev``); they may point into
        ``tensor``'s storage, so they are valid while ``tensor`` lives (and is not changed). ``options``:
        :meth:`options`, read by the caller for a batch."""
        if options is None:
            options = self.options()
        layout = self._layout(tensor, options) if self._replay else None
        if layout is None:
            buf = io.BytesIO()
            torch.save(tensor, buf)
            return [buf.getbuffer()]
        template = self._templates.get(layout, _Template)  # the class: not learnt yet
        if template is _Template:
            template = self._templates[layout] = self._template(layout, tensor, options)
        if isinstance(template, _Template):
            return template.parts(storage_bytes(tensor))
        return [self._replayed(layout, tensor, options)]

    def _records_of(self, layout: _Layout, tensor: torch.Tensor) -> list[_Record] | None:
        if layout not in self._archives:
            self._archives[layout] = self._record(tensor)
        return self._archives[layout]

    def _replayed(self, layout: _Layout, tensor: torch.Tensor, options: _Options) -> memoryview:
        """The archive of ``tensor``: its layout's records replayed, or ``torch.save``'s without records."""
        records = self._records_of(layout, tensor)
        if records is None:
            buf = io.BytesIO()
            torch.save(tensor, buf)
            return buf.getbuffer()
        return _write(records, tensor.untyped_storage(), options)

    def _template(self, layout: _Layout, tensor: torch.Tensor, options: _Options) -> _Template | None:
        nbytes = layout[4]
        records = self._records_of(layout, tensor)
        if records is None or nbytes > TEMPLATE_MAX_BYTES:
            return None
        template = _Template.learn(lambda storage: bytes(_write(records, storage, options)), nbytes)
        if template is None:
            log.debug("parity: tensor files of layout %s are replayed (no byte template)", layout[:2])
        return template

    @staticmethod
    def _layout(t: torch.Tensor, options: _Options) -> _Layout | None:
        """What a plain CPU tensor's pickle depends on, or None for a tensor that is not plain."""
        if (type(t) is not torch.Tensor or t.layout != torch.strided or t.device.type != "cpu"
                or t.requires_grad or t.is_quantized or t.is_conj() or t.is_neg() or t._backward_hooks
                or any(getattr(t, "names", ())) or t.__dict__
                or torch._utils.get_tensor_metadata(t)):  # fmt: skip
            return None
        storage = t.untyped_storage()
        return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), storage.nbytes(), *options)

    @staticmethod
    def _record(tensor: torch.Tensor) -> list[_Record] | None:
        """The records ``torch.save`` writes for ``tensor``'s layout, or None: not replayable."""
        archive = _Records()
        try:
            torch.serialization._save(tensor, archive, pickle, 2, False)
        except _NotReplayable as exc:
            log.debug("parity: tensor files of this layout go through torch.save (record %s)", exc)
            return None
        except (AttributeError, TypeError) as exc:  # another torch's internals
            log.debug("parity: tensor files go through torch.save: %s", exc)
            return None
        return archive.records


def _write(records: list[_Record], storage: Any, options: _Options) -> memoryview:
    """``records`` through torch's zip writer, with ``storage`` (torch's stubs name TypedStorage; it takes
    either) as the data record."""
    buf = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(buf, *options)
    for name, data in records:
        if data is _STORAGE:
            writer.write_record(name, storage, storage.nbytes())
        else:
            writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return buf.getbuffer()
