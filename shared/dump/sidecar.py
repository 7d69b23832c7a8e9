"""A parsed dump.json kept beside it (the *sidecar*), so a dump is parsed once and read many times.

The server parses every dump.json once, when its run is completed, and stores the columns next to it; the
compare tasks read those instead of parsing the file again. The sidecar is ``marshal`` of the header, then of
each column of ``DumpColumns.to_wire()`` in turn: the fastest round trip the standard library has, and exact
(NaN bits, big integers, p2p dicts). One column at a time, so writing it never holds more than the largest
column's bytes beside the columns (one blob of everything held twice that: +140 MB for a 150 MB dump.json, in
the validation's child). A sidecar of an earlier version (1: one blob of ``(header, wire)``; 2: without the
shapes' dimensions and the arguments' types) is not read: its dump.json is parsed again.

``marshal`` is not safe against crafted input, so a sidecar is only ever read from the server's own store,
under a key derived from the blob it was made from, never from an upload.
"""

from __future__ import annotations

import io
import marshal
from pathlib import Path
from typing import BinaryIO

from parity.shared.dump.columns import DumpColumns
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.errors import DumpError

#: The file name of a dump.json's sidecar in a rank folder.
SIDECAR_NAME = "dump.columns"
_MAGIC = "parity-dump-columns"
_VERSION = 3
_WIRE_FIELDS = 17  # the items of DumpColumns.to_wire()


def dump_sidecar(dump: Dump, out: BinaryIO) -> None:
    """Write ``dump``'s sidecar to ``out``: its header, then its columns one by one."""
    header = (_MAGIC, _VERSION, dump.task, dump.level, dump.framework, dump.dump_data_dir, dump.has_md5)
    marshal.dump(header, out)
    for column in dump.columns.iter_wire():
        marshal.dump(column, out)


def write_sidecar(dump: Dump, path: Path) -> None:
    """``dump``'s sidecar as the file ``path``."""
    with open(path, "wb") as out:
        dump_sidecar(dump, out)


def encode_sidecar(dump: Dump) -> bytes:
    """``dump``'s sidecar as bytes."""
    out = io.BytesIO()
    dump_sidecar(dump, out)
    return out.getvalue()


class StaleSidecar(DumpError):
    """A sidecar of an earlier version of this format: its dump.json is to be parsed again."""


def decode_sidecar(raw: bytes, dump_json: Path) -> Dump:
    """The ``Dump`` a sidecar holds, as ``load_dump(dump_json)`` would give it; ``StaleSidecar`` for one of
    an earlier version, ``DumpError`` if it is not a sidecar of this format."""
    try:
        stream = io.BytesIO(raw)
        first = marshal.load(stream)
        if len(first) == 2:  # version 1: (header, wire) in one blob
            raise StaleSidecar(dump_json, f"{SIDECAR_NAME} of version 1")
        magic, version, task, level, framework, dump_data_dir, has_md5 = first
        if magic == _MAGIC and version in (1, 2):
            raise StaleSidecar(dump_json, f"{SIDECAR_NAME} of version {version}")
        wire = tuple(marshal.load(stream) for _ in range(_WIRE_FIELDS))
    except (EOFError, ValueError, TypeError) as exc:
        raise DumpError(dump_json, f"unreadable {SIDECAR_NAME}: {exc}") from None
    if magic != _MAGIC or version != _VERSION:
        raise DumpError(dump_json, f"{SIDECAR_NAME} of another format ({magic!r} {version!r})")
    return Dump(path=dump_json, task=task, level=level, framework=framework, dump_data_dir=dump_data_dir,
                columns=DumpColumns.from_wire(wire), has_md5=has_md5)  # fmt: skip


def dump_task(task: str, has_md5: bool) -> str:
    """What a dump holds, in one word: its task, or ``md5`` for statistics with checksums (msprobe's
    ``summary_mode: md5``), which compare only with checksums (``compare.engine.detect_mode``)."""
    return "md5" if task == "statistics" and has_md5 else task


def sidecar_task(path: Path) -> str:
    """:func:`dump_task` of the dump whose sidecar is the file ``path``, from its header alone (the columns
    are not read); ``DumpError`` if it is not a sidecar of this format."""
    try:
        with open(path, "rb") as stream:
            first = marshal.load(stream)
        header = first[0] if len(first) == 2 else first  # version 1: (header, wire) in one blob
        magic, _version, task, _level, _framework, _data_dir, has_md5 = header
    except (EOFError, ValueError, TypeError) as exc:
        raise DumpError(path, f"unreadable {SIDECAR_NAME}: {exc}") from None
    if magic != _MAGIC:
        raise DumpError(path, f"{SIDECAR_NAME} of another format ({magic!r})")
    return dump_task(str(task), bool(has_md5))


def read_dump(dump_json: Path) -> Dump:
    """The dump from its sidecar when one lies beside it (``dump.columns``), else parsed from the file."""
    sidecar = Path(dump_json).with_name(SIDECAR_NAME)
    try:
        raw = sidecar.read_bytes()
    except FileNotFoundError:
        return load_dump(dump_json)
    try:
        return decode_sidecar(raw, Path(dump_json))
    except StaleSidecar:
        return load_dump(dump_json)
