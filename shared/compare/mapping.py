"""msprobe's data mapping (``-dm data_mapping.yaml``, compare.md §3.5): the user's pairs, over the alignment.

The file is msprobe's: one YAML mapping from an NPU (target) row name to a bench row name::

    Functional.scaled_dot_product_attention.1.forward.output.0: Torch.matmul.3.forward.output.0

Parity also takes a call on each side (``Functional.scaled_dot_product_attention.1.forward:
Torch.matmul.3.forward``): the two calls' rows then pair by their names after the call
(``.input.0`` with ``.input.0``). A mapped pair overrides whatever the alignment chose for those rows;
every other row keeps its pairing. Unlike msprobe, a name found on neither side is an error naming the file
and the entry (msprobe silently leaves such a row unmatched), and so is a malformed file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from parity.shared.bounded_yaml import load_bounded
from parity.shared.errors import CompareInputError

if TYPE_CHECKING:
    from parity.shared.compare.pairing import Pairing
    from parity.shared.compare.rows import SideRows

__all__ = [
    "DataMapping", "MappingChain", "ModuleMapping", "RowMapping", "load_data_mapping", "load_module_mapping",
    "parse_data_mapping",
]  # fmt: skip

BASIS_MAPPED = "mapped"


class RowMapping(Protocol):
    """A user's pairs over the alignment (``-dm``, ``-cm``): ``apply`` returns the pairing with its rows
    paired as it says, marking them ``mapped`` in ``basis``."""

    def apply(self, npu: SideRows, bench: SideRows, pairing: Pairing, basis: list[str]) -> Pairing: ...


@dataclass(frozen=True, slots=True)
class DataMapping:
    """The pairs of a data mapping file, in file order, and the file they came from (for messages)."""

    pairs: tuple[tuple[str, str], ...]
    source: str = "data_mapping.yaml"

    def _where(self, key: str, value: str) -> str:
        return f"{self.source}: entry '{_clip(key)}: {_clip(value)}'"

    def apply(self, npu: SideRows, bench: SideRows, pairing: Pairing, basis: list[str]) -> Pairing:
        """``pairing`` with the mapped rows paired as the file says (``basis`` marked ``mapped``, in
        place); the bench rows nobody pairs with are recomputed."""
        from parity.shared.compare.pairing import Pairing

        index = list(pairing.bench_index)
        n_rows = _first_rows(npu.names)
        b_rows = _first_rows(bench.names)
        n_calls, b_calls = _call_rows(npu.apis), _call_rows(bench.apis)
        for key, value in self.pairs:
            if key in n_rows:
                if value not in b_rows:
                    raise CompareInputError(f"{self._where(key, value)}: '{_clip(value)}' is no row of the "
                                            "bench dump (a row name maps to a row name)")  # fmt: skip
                for r in n_rows[key]:
                    index[r], basis[r] = b_rows[value][0], BASIS_MAPPED
            elif key in n_calls:
                if value not in b_calls:
                    raise CompareInputError(f"{self._where(key, value)}: '{_clip(value)}' is no call of the "
                                            "bench dump (a call name maps to a call name)")  # fmt: skip
                start, stop = b_calls[value]
                by_suffix = {bench.names[j][len(value) :]: j for j in range(start, stop)}
                start, stop = n_calls[key]
                for r in range(start, stop):
                    j = by_suffix.get(npu.names[r][len(key) :])
                    if j is not None:
                        index[r], basis[r] = j, BASIS_MAPPED
            else:
                raise CompareInputError(f"{self._where(key, value)}: '{_clip(key)}' is no row or call of "
                                        "the NPU (target) dump")  # fmt: skip
        used = set(index)
        return Pairing(index, [j for j in range(len(bench.names)) if j not in used])


def _first_rows(names: Sequence[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, name in enumerate(names):
        out.setdefault(name, []).append(r)
    return out


def _call_rows(apis: Sequence[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for r, api in enumerate(apis):
        start, _ = out.get(api, (r, r))
        out[api] = (start, r + 1)
    return out


def parse_data_mapping(doc: Any, *, source: str = "data_mapping.yaml") -> DataMapping:
    """Check a parsed mapping document: a non-empty mapping of non-empty names to non-empty names."""
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise CompareInputError(f"{source}: must be a YAML mapping of NPU names to bench names, got {kind}")
    if not doc:
        raise CompareInputError(f"{source}: has no entries (expected NPU name: bench name lines)")
    pairs = []
    for n, (key, value) in enumerate(doc.items(), 1):
        for what, name in (("NPU name", key), ("bench name", value)):
            if not isinstance(name, str) or not name.strip():
                entry = f"'{_clip(key)}'" if isinstance(key, str) else f"{n}"
                raise CompareInputError(
                    f"{source}: entry {entry}: the {what} must be a non-empty string, got {_shown(name)}"
                )
        pairs.append((key.strip(), value.strip()))
    return DataMapping(tuple(pairs), source)


#: the longest value a message repeats; a longer one (or a list, a mapping) is named by its kind and size
_SHOWN = 120


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text):,} characters)"


def _shown(value: Any) -> str:
    """``value`` for an error message, never echoing more than ``_SHOWN`` characters of a file's content."""
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'mapping'} of {len(value)} items"
    return _clip(repr(value))


def load_data_mapping(path: str | Path) -> DataMapping:
    """Read and check a data mapping YAML file (msprobe's ``-dm``)."""
    return parse_data_mapping(read_yaml(Path(path), "data mapping"), source=str(path))


def read_yaml(path: Path, what: str) -> Any:
    """One of msprobe's YAML files (safely loaded); a missing, unreadable or malformed file becomes a
    ``CompareInputError`` naming it (and the line and column)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CompareInputError(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise CompareInputError(f"{path}: is a directory, expected a {what} YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareInputError(f"{path}: cannot read the {what} file: {exc}") from None
    try:
        return load_bounded(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CompareInputError(f"{path}: not valid YAML{where}: {problem}") from None


#: msprobe 26's split of a module row name into its ``{module path}.{class}`` and what follows
_MODULE_PART = re.compile(r"\.(?:forward|backward|parameters_grad)(?:\.|$)")


@dataclass(frozen=True, slots=True)
class ModuleMapping:
    """msprobe 26's module mapping (``-cm cell_mapping.yaml``) for PyTorch dumps: target module names
    (``{module path}.{class}``, or a part of one such as a class name) to golden ones::

        MindSpeedTELayerNormColumnParallelLinear: TELayerNormColumnParallelLinear

    A module row's ``{module}.{class}`` (``Module.`` or MindSpore's ``Cell.`` stripped) that equals an entry
    is replaced whole; otherwise every entry found in it is replaced once, in file order (msprobe 26's
    rule, ``process_cell_mapping``). The row then pairs with the bench row of the new name, overriding
    what the alignment chose; a new name the bench does not have leaves the row as the alignment paired it.
    Unlike msprobe, an entry that names no module of the target dump is an error naming the file and the
    entry (msprobe leaves it unused without a word). API rows are left alone: they have no module.
    """

    pairs: tuple[tuple[str, str], ...]
    source: str = "cell_mapping.yaml"

    def module_of(self, name: str) -> tuple[str, str, str] | None:
        """``(prefix, module.class, rest)`` of a module row name, None for any other row."""
        head, _, tail = name.partition(".")
        if head not in ("Module", "Cell") or not tail:
            return None
        found = _MODULE_PART.search(tail)
        if found is None:
            return None
        return "Module.", tail[: found.start()], tail[found.start() :]

    def mapped(self, module: str) -> tuple[str, list[str]]:
        """``module`` as mapped, and the entries that changed it."""
        exact = dict(self.pairs)
        if module in exact:
            return exact[module], [module]
        used = []
        for target, golden in self.pairs:
            if target in module:
                module = module.replace(target, golden, 1)
                used.append(target)
        return module, used

    def apply(self, npu: SideRows, bench: SideRows, pairing: Pairing, basis: list[str]) -> Pairing:
        from parity.shared.compare.pairing import Pairing

        index = list(pairing.bench_index)
        b_rows = {name: j for j, name in reversed(list(enumerate(bench.names)))}
        used: set[str] = set()
        cache: dict[str, tuple[str, list[str]]] = {}
        for r, name in enumerate(npu.names):
            parts = self.module_of(name)
            if parts is None:
                continue
            prefix, module, rest = parts
            if module not in cache:
                cache[module] = self.mapped(module)
            new_module, entries = cache[module]
            used.update(entries)
            j = b_rows.get(prefix + new_module + rest)
            if entries and j is not None:
                index[r], basis[r] = j, BASIS_MAPPED
        for target, golden in self.pairs:
            if target not in used:
                entry = f"{self.source}: entry '{_clip(target)}: {_clip(golden)}'"
                raise CompareInputError(f"{entry}: '{_clip(target)}' is no module "
                                        "(or part of a module name) of the target dump")  # fmt: skip
        taken = set(index)
        return Pairing(index, [j for j in range(len(bench.names)) if j not in taken])


@dataclass(frozen=True, slots=True)
class MappingChain:
    """Several mappings applied in turn (``-cm`` then ``-dm``): a later one overrides an earlier one."""

    mappings: tuple[RowMapping, ...]

    def apply(self, npu: SideRows, bench: SideRows, pairing: Pairing, basis: list[str]) -> Pairing:
        for mapping in self.mappings:
            pairing = mapping.apply(npu, bench, pairing, basis)
        return pairing


def load_module_mapping(path: str | Path) -> ModuleMapping:
    """Read and check a module mapping YAML file (msprobe 26's ``-cm``): the same shape as ``-dm``'s, a
    mapping of non-empty names to non-empty names, read by the same checked reader."""
    data = load_data_mapping(path)
    return ModuleMapping(data.pairs, data.source)
