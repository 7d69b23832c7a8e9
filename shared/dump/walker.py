"""Flatten the parsed entries of one dump.json into columns (dump-format.md §4, compare.md §2).

Every entry becomes the list of its leaves (one per tensor or non-tensor argument, named by msprobe's
``.index`` / ``.key`` recursion), so the compare engine never walks the JSON again. The walker is lenient
where msprobe dumps legitimately vary (missing Mean/Norm, null leaves, every non-tensor encoding of §4.3)
and strict where a value would silently break a comparison (a shape that is not a list, a non-bool
requires_grad): those raise a ``DumpError`` naming the file, the entry and the field.

It walks plain dicts and lists, as any JSON parser gives them; ``typed_walk`` feeds it typed records instead
for the common leaves and hands it everything else.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from parity.shared.dump.columns import STATE_PARAMETERS_GRAD, ColumnsBuilder
from parity.shared.errors import DumpError

#: msprobe refuses deeper nesting (compare.md §2); so do we, with a clear error instead of a RecursionError.
MAX_DEPTH = 400

#: entry keys that hold leaves, in the row order of compare.md §2 (inputs + kwargs → parameters → outputs),
#: with the name suffix and the row state each one maps to.
CONTAINERS: tuple[tuple[str, str, str], ...] = (
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


#: the statistics of a null leaf
NONE4 = (None, None, None, None)


class LeafWalker:
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
        cols.entry_starts.append(len(cols))
        if "parameters_grad" in name and "parameters_grad" in name.split("."):
            # ``{param_name: [leaf]}``: the whole entry is one container (compare.md §2).
            self.walk(data, name, STATE_PARAMETERS_GRAD, 0)
            return
        get = data.get
        for key, suffix, state in CONTAINERS:
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
            # msprobe (8.3.3 and before) names a parameter gradient's leaf after its parameter alone: the
            # one-element list around it adds no index (``...parameters_grad.weight``, not ``.weight.0``).
            grad = state == STATE_PARAMETERS_GRAD
            for i, item in enumerate(node):
                sub = path if grad else f"{path}.{i}"
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
            self.cols.add(path, state, None, None, None, NONE4, None, None, False)
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
            if type(md5) is float:  # msprobe 26's xor checksum of a 0-d float tensor: its value
                md5 = repr(md5)
            elif type(md5) is not str:
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
        cols.add_fields(path, state, dtype, text, requires_grad, md5, data_name, True)

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
            # "value" is absent) do not get the same checksum; a lone surrogate (valid JSON) is hashed too.
            text = str(stat if stat is not None else value).encode("utf-8", "surrogatepass")
            md5 = f"{zlib.crc32(text) & 0xFFFFFFFF:08x}"
        stats = (stat, stat, stat, stat)
        self.cols.arg_types[len(self.cols)] = kind
        self.cols.add(path, state, dtype, shape, requires_grad, stats, md5, data_name, False)

    def p2p_leaf(self, rec: dict[str, Any], path: str, state: str) -> None:
        """A ``torch.distributed.P2POp``: the row is its tensor, with op/peer/tag kept for diff analysis."""
        tensor = rec.get("tensor")
        p2p = {k: rec.get(k) for k in ("op", "peer", "tag", "group_id")}
        row = len(self.cols)
        if isinstance(tensor, dict) and type(tensor.get("type")) is str:
            self.leaf(tensor, path, state)
        elif tensor is None:
            self.cols.add(path, state, None, None, None, NONE4, None, None, False)
        else:
            raise self.error(f"{path}.tensor", f"must be a tensor record, not {tensor!r}")
        self.cols.p2p[row] = p2p
