"""Read msprobe's dump.json, stack.json and construct.json (dump-format.md §4) into plain Python objects.

The reader validates and flattens in one walk: every entry becomes the list of its leaves (one per tensor or
non-tensor argument, named by msprobe's ``.index`` / ``.key`` recursion, compare.md §2), so the compare engine
never walks the JSON again. It is lenient where msprobe dumps legitimately vary (bare NaN/Infinity tokens,
missing Mean/Norm, null leaves, every non-tensor encoding of §4.3) and strict where a value would silently
break a comparison (a shape that is not a list, a non-bool requires_grad): those raise a ``DumpError`` naming
the file, the entry and the field.

Only the standard library is used: ``json`` accepts the bare NaN/Infinity/-Infinity tokens msprobe writes, and
no pandas frame is built (the engine must read ~60k rows a side in well under a second).
"""

from __future__ import annotations

import gc
import json
import logging
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parity.shared.dump.columns import (
    STATE_PARAMETERS_GRAD,
    ColumnsBuilder,
    DumpColumns,
    DumpEntry,
)
from parity.shared.errors import DumpError

try:  # optional speed-up: the reader is correct without it
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _orjson = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: msprobe refuses deeper nesting (compare.md §2); so do we, with a clear error instead of a RecursionError.
MAX_DEPTH = 400

#: entry keys that hold leaves, in the row order of compare.md §2 (inputs + kwargs → parameters → outputs),
#: with the name suffix and the row state each one maps to.
_CONTAINERS: tuple[tuple[str, str, str], ...] = (
    ("input_args", ".input", "input"),
    ("input_kwargs", ".input", "input"),
    ("input", ".input", "input"),
    ("parameters", ".parameters", "parameters"),
    ("output", ".output", "output"),
)

_P2POP = "torch.distributed.P2POp"
_RANK_ARGS = frozenset({"src", "dst", "group_src", "group_dst"})
_STAT_TYPES = frozenset({type(None), bool, int, float, str})
_PY_TYPE_NAMES: dict[type, str] = {t: str(t) for t in (bool, int, float, str, type(None), list, dict)}


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
        return self.path.parent / "dump_tensor_data"

    def leaf_count(self) -> int:
        """How many rows this dump yields."""
        return len(self.columns)


@contextmanager
def gc_paused() -> Iterator[bool]:
    """Pause the cyclic garbage collector while building many small acyclic objects.

    Parsing a dump allocates millions of dicts and floats and none of them form cycles, yet each allocation
    burst triggers full collections that scan them all: measured, that was 60% of the time of a statistics
    compare. Reference counting still frees everything; the collector resumes (if it was on) on exit.
    Yields whether it was on, so a long phase inside (tensor workers) can turn it back on meanwhile. Pause
    once around a whole job: each resume makes the next allocation collect everything allocated meanwhile.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield was_enabled
    finally:
        if was_enabled:
            gc.enable()


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """Parse one JSON file; a missing file or malformed JSON becomes a ``DumpError`` with line and column."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DumpError(path, f"{what} not found") from None
    except IsADirectoryError:
        raise DumpError(path, f"is a directory, expected a {what}") from None
    except OSError as exc:
        raise DumpError(path, f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        return _parse_json(raw)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise DumpError(path, f"malformed JSON: {exc.msg}", where=where) from None
    except UnicodeDecodeError as exc:
        raise DumpError(path, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def _parse_json(raw: bytes) -> Any:
    """orjson where it can read the file, the standard library where only it can.

    orjson parses a dump about 1.6x faster, but (like the JSON standard) it refuses the bare NaN / Infinity /
    -Infinity tokens msprobe writes, integers beyond 64 bits and a few other liberties; the standard library
    accepts them all (``allow_nan``). A file that orjson refuses is parsed again by the standard library,
    which also gives the error message (with line and column) for a file that is really malformed.
    """
    if _orjson is not None and b"NaN" not in raw and b"Infinity" not in raw:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


_NONE4 = (None, None, None, None)


class _Walker:
    """Flattens the entries of one dump.json into columns; holds the file path only so errors can name it."""

    __slots__ = ("path", "entry", "has_md5", "cols", "shape_text", "same_text")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entry = ""
        self.has_md5 = False
        self.cols = ColumnsBuilder()
        self.shape_text: dict[tuple[Any, ...], str] = {}  # most shapes repeat: format each once
        self.same_text: dict[str, str] = {}

    def error(self, field_path: str, problem: str) -> DumpError:
        return DumpError(self.path, problem, where=f"entry {self.entry!r} field {field_path!r}")

    def add_entry(self, name: str, data: Any) -> None:
        self.entry = name
        if not isinstance(data, dict):
            raise DumpError(self.path, "must be an object", where=f"entry {name!r}")
        cols = self.cols
        cols.entry_names.append(name)
        cols.entry_starts.append(len(cols.rows))
        if "parameters_grad" in name and "parameters_grad" in name.split("."):
            # ``{param_name: [leaf]}``: the whole entry is one container (compare.md §2).
            self.walk(data, name, STATE_PARAMETERS_GRAD, 0)
            return
        get = data.get
        for key, suffix, state in _CONTAINERS:
            node = get(key)
            if node is None:
                continue
            if not isinstance(node, (list, dict)):
                raise self.error(key, f"must be a list or an object, not {type(node).__name__}")
            if node:  # ``[]`` and ``{}`` yield no row
                self.walk(node, name + suffix, state, 0)

    def walk(self, node: Any, path: str, state: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.error(path, f"nested deeper than {MAX_DEPTH} levels")
        kind = type(node)
        if kind is list:
            for i, item in enumerate(node):
                sub = f"{path}.{i}"
                if type(item) is dict and type(item.get("type")) is str:
                    self.leaf(item, sub, state)  # the common case, without a recursive call
                else:
                    self.walk(item, sub, state, depth + 1)
        elif kind is dict:
            if type(node.get("type")) is str:
                self.leaf(node, path, state)
            elif node.get("class_type") == _P2POP:
                self.p2p_leaf(node, path, state)
            else:  # a plain container (kwargs, nested dicts, namedtuples); ``{}`` yields no row
                for key, value in node.items():
                    self.walk(value, f"{path}.{key}", state, depth + 1)
        elif node is None:
            self.cols.add(path, state, None, None, None, _NONE4, None, None, False)
        else:
            raise self.error(path, f"expected an object, a list or null, not {kind.__name__} {node!r}")

    def leaf(self, rec: dict[str, Any], path: str, state: str) -> None:
        # The hot path of the reader (one call per row): plain lookups, checks inlined, errors out of line,
        # and a tensor's row appended to the columns here rather than through DumpColumns.add.
        get = rec.get
        dtype = get("dtype")
        rg = get("requires_grad")
        md5 = get("md5")
        data_name = get("data_name")
        if rg is True:
            requires_grad: str | None = "True"
        elif rg is False:
            requires_grad = "False"
        elif rg is None:
            requires_grad = None
        else:
            raise self.error(f"{path}.requires_grad", f"must be a bool, not {rg!r}")
        if md5 is not None:
            if type(md5) is not str:
                raise self.error(f"{path}.md5", f"must be a string, not {md5!r}")
            self.has_md5 = True
        if data_name is not None and type(data_name) is not str:
            raise self.error(f"{path}.data_name", f"must be a string, not {data_name!r}")
        if dtype is None:
            self.scalar_leaf(rec, path, state, requires_grad, md5, data_name)
            return
        # A tensor-like leaf: torch.Tensor and its subclasses (DTensor, ...), numpy.ndarray.
        if type(dtype) is not str:
            raise self.error(f"{path}.dtype", f"must be a string, not {dtype!r}")
        shape = get("shape")
        if type(shape) is not list:
            if "shape" not in rec:
                raise self.error(f"{path}.shape", "missing (a tensor leaf needs its shape)")
            raise self.error(f"{path}.shape", f"must be a list, not {shape!r}")
        mx, mn, mean, norm = get("Max"), get("Min"), get("Mean"), get("Norm")
        dtype = self.same_text.setdefault(dtype, dtype)  # one object per dtype: cheaper to ship and compare
        cols = self.cols
        if type(mx) is float and type(mn) is float and type(mean) is float and type(norm) is float:
            cols.stats.extend((mx, mn, mean, norm))
            cols.plain.append(1)
        else:
            ok = _STAT_TYPES
            if type(mx) not in ok or type(mn) not in ok or type(mean) not in ok or type(norm) not in ok:
                raise self.bad_stats(path, (mx, mn, mean, norm))
            if mx is None and "tensor_stat_index" in rec:
                raise self.error(path, "holds a 'tensor_stat_index' placeholder: the dump was never flushed "
                                       "(was PrecisionDebugger.stop() or step() called?)")  # fmt: skip
            cols.add_stats((mx, mn, mean, norm))
        try:
            key = tuple(shape)
            text = self.shape_text.get(key)
            if text is None:
                text = self.shape_text[key] = str(shape)
        except TypeError:  # a nested list in a shape: unhashable, and rare
            text = str(shape)
        cols.rows.append((path, state, dtype, text, requires_grad, md5, data_name, True))

    def bad_stats(self, path: str, stats: tuple[Any, ...]) -> DumpError:
        for stat_name, value in zip(("Max", "Min", "Mean", "Norm"), stats, strict=True):
            if type(value) not in _STAT_TYPES:
                return self.error(f"{path}.{stat_name}", f"must be a number, a bool or null, not {value!r}")
        return self.error(path, "bad statistics")

    def scalar_leaf(
        self, rec: dict[str, Any], path: str, state: str, requires_grad: str | None, md5: str | None,
        data_name: str | None,
    ) -> None:  # fmt: skip
        """A non-tensor argument (dump-format.md §4.3): stats = the value, shape ``[]`` (compare.md §2)."""
        kind = rec["type"]
        if kind.endswith("Tensor"):
            raise self.error(f"{path}.dtype", f"missing (a {kind} leaf needs its dtype)")
        value = rec.get("value")
        shape = "[]"
        if kind == "torch.Size":
            dtype, shape, stat = kind, str(value), None
        elif kind == "slice":
            dtype, stat = kind, None
            shape = f"({len(value)},)" if isinstance(value, list) else "()"  # msprobe: str(np.shape(value))
        elif kind == "ellipsis":
            dtype, stat = kind, value
        elif kind == "torch.ProcessGroup":
            dtype, stat = kind, str(rec.get("group_ranks"))
        elif kind == "torch.memory_format":
            # msprobe stores the format under "format" and reads "value" (always None); keep what was dumped.
            stat = rec.get("format", value)
            dtype = _PY_TYPE_NAMES.get(type(stat)) or str(type(stat))
        elif path.rsplit(".", 1)[-1] in _RANK_ARGS:
            dtype, stat = kind, value
        else:
            dtype = _PY_TYPE_NAMES.get(type(value)) or str(type(value))
            stat = value
        if isinstance(stat, (list, dict)):
            stat = str(stat)  # a cell holds scalars only: an odd container value is shown as Python prints it
        if md5 is None:
            # msprobe hashes str(value); we hash what the row shows, so two different process groups (whose
            # "value" is absent) do not get the same checksum.
            md5 = f"{zlib.crc32(str(stat if stat is not None else value).encode()) & 0xFFFFFFFF:08x}"
        stats = (stat, stat, stat, stat)
        self.cols.add(path, state, dtype, shape, requires_grad, stats, md5, data_name, False)

    def p2p_leaf(self, rec: dict[str, Any], path: str, state: str) -> None:
        """A ``torch.distributed.P2POp``: the row is its tensor, with op/peer/tag kept for diff analysis."""
        tensor = rec.get("tensor")
        p2p = {k: rec.get(k) for k in ("op", "peer", "tag", "group_id")}
        row = len(self.cols.rows)
        if isinstance(tensor, dict) and type(tensor.get("type")) is str:
            self.leaf(tensor, path, state)
        elif tensor is None:
            self.cols.add(path, state, None, None, None, _NONE4, None, None, False)
        else:
            raise self.error(f"{path}.tensor", f"must be a tensor record, not {tensor!r}")
        self.cols.p2p[row] = p2p


def load_dump(path: str | Path) -> Dump:
    """Read one dump.json: header fields and every entry's leaves, in file order.

    Raises ``DumpError`` naming the file (and line/column, or entry/field) for a missing or malformed file.
    """
    path = Path(path)
    with gc_paused():
        return _load_dump(path)


def _load_dump(path: Path) -> Dump:
    doc = read_json(path, "dump.json")
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
    level = doc.get("level")
    framework = doc.get("framework") or "pytorch"
    dump_data_dir = doc.get("dump_data_dir")
    walker = _Walker(path)
    for name, value in data.items():
        walker.add_entry(name, value)
    columns = walker.cols.build()
    logger.debug("read %s: task %s, %d entries, %d rows", path, task, len(columns.entry_names), len(columns))
    return Dump(
        path=path,
        task=task,
        level=level if isinstance(level, str) else None,
        framework=framework if isinstance(framework, str) else "pytorch",
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
    doc = read_json(path, "stack.json")
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
    doc = read_json(path, "construct.json")
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
