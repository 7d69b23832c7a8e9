"""Read msprobe's dump.json, stack.json and construct.json (dump-format.md §4) into plain Python objects.

A dump.json is read the fast way when it can be (``typed_walk``: msgspec decodes it into typed records, about
twice as fast overall) and the classic way otherwise: a JSON parse into dicts, walked by ``LeafWalker``. Both
give the same columns; the classic way accepts everything msprobe writes (bare NaN/Infinity tokens anywhere,
integers beyond 64 bits, nested containers, P2POp records) and words every error, with line and column for
malformed JSON and entry and field for a bad value.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.shared.dump.columns import DumpColumns, DumpEntry
from parity.shared.dump.layout import CONSTRUCT_JSON, DUMP_JSON, STACK_JSON, TENSOR_DIR
from parity.shared.dump.walker import LeafWalker
from parity.shared.errors import DumpError

try:  # optional speed-ups: the reader is correct without them
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _orjson = None  # type: ignore[assignment]
try:
    from parity.shared.dump.typed_walk import walk_typed
except ImportError:  # pragma: no cover - msgspec is a declared dependency
    walk_typed = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Dump:
    """A whole dump.json: its header and its entries in file order (the order compare uses, §3.1)."""

    path: Path
    task: str
    level: str | None
    framework: str
    dump_data_dir: str | None
    columns: DumpColumns = field(default_factory=DumpColumns)
    has_md5: bool = False  # some leaf carries an ``md5`` key: selects md5 mode for statistics dumps (§1.4)

    @property
    def entries(self) -> list[DumpEntry]:
        """Every entry in file order with its leaves, built from the columns on each call."""
        return self.columns.entries()

    @property
    def tensor_dir(self) -> Path:
        """Where compare looks for tensors: ``dump_tensor_data`` next to dump.json (not dump_data_dir)."""
        return self.path.parent / TENSOR_DIR


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """Parse one JSON file; a missing file or malformed JSON becomes a ``DumpError`` with line and column."""
    path = Path(path)
    return parse_json(path, read_file(path, what))


def read_file(path: Path, what: str) -> bytes:
    """The bytes of ``path``; a missing or unreadable file becomes a ``DumpError`` naming it."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DumpError(path, f"{what} not found") from None
    except IsADirectoryError:
        raise DumpError(path, f"is a directory, expected a {what}") from None
    except OSError as exc:
        raise DumpError(path, f"cannot read {what}: {exc.strerror or exc}") from None


def parse_json(path: Path, raw: bytes) -> Any:
    """Parse the bytes of ``path``; malformed JSON becomes a ``DumpError`` with line and column."""
    try:
        return _parse_json(raw)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise DumpError(path, f"malformed JSON: {exc.msg}", where=where) from None
    except UnicodeDecodeError as exc:
        raise DumpError(path, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:  # an integer past Python's digit limit (int_max_str_digits)
        raise DumpError(path, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise DumpError(path, "malformed JSON: nested too deeply to parse") from None


#: an integer token of 19 digits or more: it may not fit 64 bits, and orjson would read it as a float
_LONG_INTEGER = re.compile(rb"(?<![0-9.eE+-])-?[0-9]{19,}(?![0-9.eE])")


def _parse_json(raw: bytes) -> Any:
    """orjson where it can read the file, the standard library where only it can.

    orjson parses a dump about 1.6x faster, but (like the JSON standard) it refuses the bare NaN / Infinity /
    -Infinity tokens msprobe writes, integers beyond 64 bits and a few other liberties; the standard library
    accepts them all (``allow_nan``). A file that orjson refuses is parsed again by the standard library,
    which also gives the error message (with line and column) for a file that is really malformed. orjson
    reads an integer beyond 64 bits as a float rather than refusing it, so a file that may hold one goes to
    the standard library directly.
    """
    if (_orjson is not None and b"NaN" not in raw and b"Infinity" not in raw
            and not _LONG_INTEGER.search(raw)):  # fmt: skip
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def load_dump(path: str | Path) -> Dump:
    """Read one dump.json: header fields and every entry's leaves, in file order.

    Raises ``DumpError`` naming the file (and line/column, or entry/field) for a missing or malformed file.
    """
    path = Path(path)
    raw = read_file(path, DUMP_JSON)
    typed = walk_typed(path, raw) if walk_typed is not None else None
    if typed is not None:
        header, walker = typed
        return _dump(path, header.task, header.level, header.framework, header.dump_data_dir, walker)
    doc = parse_json(path, raw)
    del raw
    if not isinstance(doc, dict):
        raise DumpError(path, f"top level must be an object, not {type(doc).__name__}")
    task = doc.get("task")
    if not isinstance(task, str):
        raise DumpError(path, f"must be a string, not {task!r}", where="field 'task'")
    data = doc.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DumpError(path, f"must be an object, not {type(data).__name__}", where="field 'data'")
    walker = LeafWalker(path)
    for name, value in data.items():
        walker.add_entry(name, value)
    return _dump(path, task, doc.get("level"), doc.get("framework"), doc.get("dump_data_dir"), walker)


def _dump(path: Path, task: str, level: Any, framework: Any, dump_data_dir: Any, walker: LeafWalker) -> Dump:
    columns = walker.cols.build(walker.shape_text)
    logger.debug("read %s: task %s, %d entries, %d rows", path, task, len(columns.entry_names), len(columns))
    return Dump(
        path=path,
        task=task,
        level=level if isinstance(level, str) else None,
        framework=framework if framework and isinstance(framework, str) else "pytorch",
        dump_data_dir=dump_data_dir if isinstance(dump_data_dir, str) else None,
        columns=columns,
        has_md5=walker.has_md5,
    )


def load_stack(path: str | Path) -> dict[str, list[str]]:
    """Read stack.json into ``{entry name: [frames, innermost first]}``.

    Accepts the current deduplicated form ``{"0": [[names], [frames]], ...}`` (recognised, as msprobe does,
    by the key ``"0"``) and the old ``{entry name: [frames]}`` form.
    """
    path = Path(path)
    doc = read_json(path, STACK_JSON)
    if not isinstance(doc, dict):
        raise DumpError(path, f"top level must be an object, not {type(doc).__name__}")
    stacks: dict[str, list[str]] = {}
    if "0" in doc:
        for key, value in doc.items():
            if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
                    and isinstance(value[1], list)):  # fmt: skip
                raise DumpError(path, "must be [[entry names], [frames]]", where=f"stack {key!r}")
            frames = [str(f) for f in value[1]]
            for name in value[0]:
                stacks[str(name)] = frames
        return stacks
    for name, frames in doc.items():
        if not isinstance(frames, list):
            raise DumpError(path, "must be a list of frames", where=f"entry {name!r}")
        stacks[name] = [str(f) for f in frames]
    return stacks


def load_construct(path: str | Path) -> dict[str, str | None]:
    """Read construct.json into ``{node: parent or None}`` (``""``, Megatron's ``[parent, n]`` normalised)."""
    path = Path(path)
    doc = read_json(path, CONSTRUCT_JSON)
    if not isinstance(doc, dict):
        raise DumpError(path, f"top level must be an object, not {type(doc).__name__}")
    out: dict[str, str | None] = {}
    for node, parent in doc.items():
        if node == "megatron_micro_step_number":
            continue
        if isinstance(parent, list):
            parent = parent[0] if parent else None
        if parent is not None and not isinstance(parent, str):
            raise DumpError(path, f"parent must be a string or null, not {parent!r}", where=f"node {node!r}")
        out[node] = parent or None
    return out
