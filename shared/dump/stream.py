"""A dump.json read incrementally, in memory bounded by its columns rather than by its text.

``load_dump`` holds the whole file and its parse at once: about 7x the file's size (a 150 MB statistics dump:
over 1 GB). The server validates every uploaded dump.json, several at once, so its validation reads them this
way instead: ijson parses the file 64 KiB at a time and hands over one entry of ``data`` at a time, which the
classic walker (``LeafWalker``) appends to the columns and drops. The result is the ``Dump`` that
``load_dump`` gives, columns and errors alike (the same walker over the same values), which is what the
server stores as the dump's sidecar.

msprobe writes bare ``NaN``/``Infinity``/``-Infinity`` tokens, which no streaming JSON parser reads. Each
token standing alone as a value is rewritten on the way in as a string that no dump holds
(``"\\u0000NaN"``) and turned back into its float in the entry. A token inside a string cannot be rewritten
into valid JSON (the new quote ends the string and leaves a backslash bare), so a file is never misread: it
fails to parse and is read by ``load_dump``. So is a file ijson does not take as it is (it holds
``\\u0000`` text already, an entry name twice, a header that is not plain strings before ``data``): those
are rare, or invalid and small. A malformed file past ``RELOAD_LIMIT`` bytes is refused with the parser's
own words rather than parsed whole again for a line and column.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, BinaryIO

from parity.shared.dump.reader import Dump, _dump, load_dump
from parity.shared.dump.walker import LeafWalker
from parity.shared.errors import DumpError

logger = logging.getLogger(__name__)

#: The bytes ijson is fed at a time.
CHUNK = 1 << 16
#: Entries between two ``pack_stats`` (the statistics as floats take 4x their packed size meanwhile).
PACK_EVERY = 1024
#: A malformed file up to this size is parsed again whole (``load_dump``) for its error's line and column.
RELOAD_LIMIT = 32 * 1024 * 1024

#: A token not followed by what would make it part of a longer word or a string; it stands alone where the
#: byte before is not one of ``_GLUED`` either. (The leading class lets the search skip ahead: 7x faster than
#: a lookbehind tried at every byte.)
_BARE_TOKEN = re.compile(rb'[-IN](?:(?<=-)Infinity|(?<=I)nfinity|(?<=N)aN)(?![\w"])')
_GLUED = frozenset(b"_.+-\\\"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: What ijson reads otherwise than ``json``, or what would pass for the marker: the file is read whole.
_REREAD = re.compile(rb"\\u0000|\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")  # NUL; surrogates
_SENTINEL = "\x00"
_TOKEN_VALUES = {f"{_SENTINEL}{name}": float(value)
                 for name, value in (("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"))}  # fmt: skip
_HOLD = 16  # bytes kept back from each chunk: a token (9 at most) and the byte after it


class _Reread(Exception):
    """The file is one the stream does not read as ``load_dump`` would: read it the classic way."""


class _QuotedTokens:
    """A binary file whose bare NaN/Infinity tokens read as the sentinel strings (see the module's doc)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.pending = b""  # read, not handed out yet: it may end in part of a token
        self.before = b" "  # the last bytes handed out: the left edge of the next token, a split ``\\u0000``
        self.replaced = False
        self.offset = 0  # bytes of the file read so far

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson's probe of what the file gives, bytes or text
            return b""
        while True:
            chunk = self.raw.read(CHUNK)  # whatever ijson asks for: the window needs its own size
            self.offset += len(chunk)
            window = self.before + self.pending + chunk
            odd = _REREAD.search(window) if b"\\u" in window or b"\xed" in window else None
            if odd is not None:
                raise _Reread(f"the file holds {odd.group()!r} (a NUL, the marker, or a surrogate)")
            base = len(self.before)
            # A token starting before ``limit`` ends, with the byte after it, inside the window.
            limit = len(window) if not chunk else len(window) - _HOLD
            if limit <= base and chunk:
                self.pending = window[base:]
                continue
            out, pos, cut = [], base, max(limit, base)
            tokens = b"NaN" in window or b"Infinity" in window
            for m in _BARE_TOKEN.finditer(window, base) if tokens else ():
                if m.start() >= limit:
                    break
                if window[m.start() - 1] in _GLUED:  # part of a word, a number or a string escape
                    continue
                out += [window[pos : m.start()], b'"\\u0000', m.group(), b'"']
                pos, cut = m.end(), max(cut, m.end())
                self.replaced = True
            out.append(window[pos:cut])
            self.before, self.pending = window[max(0, cut - 8) : cut], window[cut:]
            return b"".join(out)


def _restore(value: Any) -> Any:
    """``value`` with every sentinel string back as its float; a sentinel key was a bare token as a key,
    which ``json`` refuses (read whole, for its error)."""
    if isinstance(value, str):
        return _TOKEN_VALUES.get(value, value) if value.startswith(_SENTINEL) else value
    if isinstance(value, dict):
        if any(k.startswith(_SENTINEL) for k in value):
            raise _Reread("a NaN/Infinity token as a key")
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def stream_dump(path: str | Path) -> Dump:
    """``load_dump(path)``, parsed incrementally: the same ``Dump`` or the same ``DumpError``, without ever
    holding the file's text or its whole parse."""
    import ijson

    path = Path(path)
    try:
        header = _header(path)
        walker = LeafWalker(path)
        with path.open("rb") as fh:
            stream = _QuotedTokens(fh)
            try:
                names = walker.cols.entry_names
                for name, value in ijson.kvitems(stream, "data", use_float=True):
                    if name.startswith(_SENTINEL):
                        raise _Reread("a NaN/Infinity token as an entry name")
                    walker.add_entry(name, _restore(value) if stream.replaced else value)
                    if len(names) % PACK_EVERY == 0:
                        walker.cols.pack_stats()
            except ijson.JSONError as exc:
                if path.stat().st_size <= RELOAD_LIMIT:
                    raise _Reread(f"not parsed: {exc}") from None
                problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise DumpError(path, f"malformed JSON: {problem}",
                                where=f"within the first {stream.offset} bytes") from None  # fmt: skip
        if len(set(names)) != len(names):  # ``json`` keeps one entry of a name given twice
            raise _Reread("an entry name twice")
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise DumpError(path, "dump.json not found") from None
        raise DumpError(path, f"cannot read dump.json: {exc.strerror or exc}") from None
    except _Reread as why:
        logger.debug("%s: read whole (%s)", path, why)
        return load_dump(path)
    task, level, framework, dump_data_dir = header
    return _dump(path, task, level, framework, dump_data_dir, walker)


def _header(path: Path) -> tuple[str, Any, Any, Any]:
    """task, level, framework and dump_data_dir: the top-level strings before ``data`` (where msprobe and
    Parity write them), after a check that ``data`` is an object or null."""
    import ijson

    values: dict[str, Any] = {}
    key = None
    with path.open("rb") as fh:
        events = ijson.parse(_QuotedTokens(fh))
        try:
            prefix, event, value = next(events)
            if event != "start_map":
                raise _Reread("the top level is not an object")
            for prefix, event, value in events:
                if prefix == "" and event == "map_key":
                    key = value
                    if key.startswith(_SENTINEL):
                        raise _Reread("a NaN/Infinity token as a key")
                    if key == "data":
                        _, event, _ = next(events)
                        if event not in ("start_map", "null"):
                            raise _Reread("data is not an object")
                        break
                elif prefix == key and event in ("string", "null"):
                    values[key] = _restore(value)
                elif event in ("start_map", "start_array", "number", "boolean") and prefix == key:
                    raise _Reread(f"a header field {key!r} that is not a string")
        except (ijson.JSONError, StopIteration):
            raise _Reread("the header does not parse") from None
    task = values.get("task")
    if not isinstance(task, str) or key != "data":
        raise _Reread("no task before data")
    return task, values.get("level"), values.get("framework"), values.get("dump_data_dir")
