"""A tensor's ``.pt`` file: the bytes ``torch.save`` writes, at a fraction of its CPU cost.

A planned dump writes ~160 small tensor files a step on the writer thread, whose CPU time (and GIL) is
taken from training on a small host. Most of ``torch.save``'s time for a small tensor goes into pickling
the tensor (typed storages, a persistent-id call per pickled object), yet for a plain CPU tensor the
pickle depends only on its dtype, shape, strides, storage offset and storage size. :class:`TensorFiles`
runs torch's own serializer (``torch.serialization._save``) once per such layout, records the archive's
records in order, and for every later tensor of that layout replays them into torch's own zip writer
(``torch._C.PyTorchFileWriter``) with the new tensor's storage: the same records, in the same order,
through the same writer, so the file is the one ``torch.save`` writes, byte for byte (the tests check
this for every dtype). Anything else (a subclass, a tensor with Python state, hooks, names, a quantized,
sparse, conjugated or negated tensor, a torch without those internals) goes through ``torch.save``.
"""

from __future__ import annotations

import io
import logging
import pickle
from typing import Any

import torch

__all__ = ["TensorFiles"]

log = logging.getLogger(__name__)

_STORAGE = None  # in a recorded archive: where the tensor's storage goes
_Record = tuple[str, Any]  # (record name, its bytes or _STORAGE)
_Layout = tuple[Any, ...]


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


class TensorFiles:
    """Serializes tensors to ``torch.save``'s bytes; one instance per thread (its cache is not locked)."""

    def __init__(self) -> None:
        self._archives: dict[_Layout, list[_Record] | None] = {}  # None: this layout goes to torch.save
        self._replay = hasattr(torch._C, "PyTorchFileWriter") and hasattr(torch.serialization, "_save")

    def encode(self, tensor: torch.Tensor) -> memoryview:
        """The bytes ``torch.save(tensor, f)`` writes to a file object ``f``."""
        options = (torch.serialization.get_crc32_options(), torch.serialization._get_storage_alignment())
        layout = self._layout(tensor, options) if self._replay else None
        records = self._archives.get(layout) if layout is not None else None
        if layout is not None and layout not in self._archives:
            records = self._archives[layout] = self._record(tensor)
        buf = io.BytesIO()
        if records is None:
            torch.save(tensor, buf)
            return buf.getbuffer()
        writer = torch._C.PyTorchFileWriter(buf, *options)
        storage: Any = tensor.untyped_storage()  # torch's stubs name TypedStorage; it takes either
        for name, data in records:
            if data is _STORAGE:
                writer.write_record(name, storage, storage.nbytes())
            else:
                writer.write_record(name, data, len(data))
        writer.write_end_of_file()
        return buf.getbuffer()

    @staticmethod
    def _layout(t: torch.Tensor, options: tuple[bool, int]) -> _Layout | None:
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
