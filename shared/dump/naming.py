"""Entry and tensor-file names of the msprobe layout (dump-format.md §3, §5), built and parsed in one place.

The client builds names with these helpers and the engine parses them back, so both sides agree on the
grammar: API entries put the counter *before* the direction (``Functional.linear.0.forward``), module
entries put it *after* (``Module.fc.Linear.forward.0``), parameter gradients are
``Module.fc.Linear.parameters_grad.0``. Every part of the compare that needs a part of a name (its op, its
direction, its forward or backward partner, its counter, its module path) asks ``parse_entry`` here: one
grammar, parsed once per distinct name (a table repeats each entry name over its rows).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "API_PREFIXES",
    "BACKWARD",
    "FORWARD",
    "EntryName",
    "api_entry",
    "backward_of",
    "direction_of",
    "entry_family",
    "entry_op",
    "forward_of",
    "module_entry",
    "module_prefix",
    "param_grad_entry",
    "param_grad_file",
    "parse_entry",
    "tensor_file",
    "uncounted",
]

#: msprobe's API prefixes (§5); ``Module`` entries are told apart by their own grammar.
API_PREFIXES = ("Functional", "Tensor", "Torch", "VF", "NPU", "Distributed", "MindSpeed", "Aten", "Triton")

FORWARD = "forward"
BACKWARD = "backward"
PARAMETERS_GRAD = "parameters_grad"

_API_RE = re.compile(r"^(?P<prefix>[^.]+)\.(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_MODULE_RE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward)\.(?P<n>\d+)$")
_GRAD_RE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.parameters_grad\.(?P<n>\d+)$")
_NUMBER_PART = re.compile(r"\.\d+(?=\.|$)")


@dataclass(frozen=True, slots=True)
class EntryName:
    """A parsed entry name. ``kind`` is ``api``, ``module`` or ``parameters_grad``; ``direction`` is None
    for parameter gradients."""

    kind: str
    prefix: str  # the API prefix, or "Module"
    name: str  # the API name, or the module path (with a list index when the model was a list)
    cls: str | None  # the module class name; None for APIs
    index: int  # the call counter
    direction: str | None
    text: str = ""  # the whole name as parsed

    @property
    def op(self) -> str:
        """The op the entry calls, whatever its prefix: ``Tensor.__matmul__`` and ``Torch.matmul`` are both
        ``matmul``, a reflected operator its operator (``__rmul__`` is ``mul``); a module's is its class."""
        if self.cls is not None:
            return self.cls
        op = self.name
        if op.startswith("__r") and op.endswith("__") and len(op) > 5:
            return op[3:-2]
        return op.strip("_")

    @property
    def module_path(self) -> str | None:
        """A module entry's path (``blocks.0.attn``); None for an API."""
        return self.name if self.cls is not None else None

    @property
    def uncounted(self) -> str:
        """The name without its call counter (msprobe's fuzzy match, compare.md §3.4):
        ``Torch.add.3.forward`` → ``Torch.add.forward``, ``Module.fc.Linear.forward.2`` →
        ``Module.fc.Linear.forward``, ``...parameters_grad.1`` → ``...parameters_grad``."""
        if self.kind == "api":
            return f"{self.prefix}.{self.name}.{self.direction}"
        head = f"Module.{self.name}.{self.cls}"
        return f"{head}.{self.direction}" if self.kind == "module" else f"{head}.{PARAMETERS_GRAD}"

    @property
    def family(self) -> str:
        """The calls of one kind, wherever in the model: the name without its counter and without the
        numbers of its module path (``Module.blocks.1.ln.LayerNorm.forward.0`` →
        ``Module.blocks.ln.LayerNorm.forward``): what shares a gain, a precision choice, a background."""
        return _NUMBER_PART.sub("", self.uncounted) if self.kind != "api" else self.uncounted

    @property
    def forward(self) -> str:
        """The forward entry of this call (itself when it is one); a parameter gradient's own name."""
        return self._directed(FORWARD) if self.direction is not None else self.text

    @property
    def partner(self) -> str | None:
        """The other entry of the call: the backward of a forward, the forward of a backward; None for a
        parameter gradient."""
        if self.direction is None:
            return None
        return self._directed(BACKWARD if self.direction == FORWARD else FORWARD)

    def with_index(self, index: int) -> str:
        """The same entry with another call counter (v2's backward renumbering)."""
        if self.kind == PARAMETERS_GRAD:
            return f"Module.{self.name}.{self.cls}.{PARAMETERS_GRAD}.{index}"
        return EntryName(self.kind, self.prefix, self.name, self.cls, index, self.direction)._directed(
            self.direction or FORWARD)

    def _directed(self, direction: str) -> str:
        if self.kind == "api":
            return api_entry(self.prefix, self.name, self.index, direction)
        return f"Module.{self.name}.{self.cls}.{direction}.{self.index}"


def api_entry(prefix: str, api: str, index: int, direction: str = FORWARD) -> str:
    """``{Prefix}.{api}.{n}.{direction}`` (counter before direction)."""
    return f"{prefix}.{api}.{index}.{direction}"


def module_prefix(path: str, cls: str, list_index: int | None = None) -> str:
    """``Module.[{idx}.]{path}.{Class}``: the part of a module entry that does not change between calls."""
    head = f"Module.{list_index}.{path}" if list_index is not None else f"Module.{path}"
    return f"{head}.{cls}"


def module_entry(path: str, cls: str, direction: str, index: int, list_index: int | None = None) -> str:
    """``Module.{path}.{Class}.{direction}.{n}`` (counter after direction)."""
    return f"{module_prefix(path, cls, list_index)}.{direction}.{index}"


def param_grad_entry(path: str, cls: str, index: int, list_index: int | None = None) -> str:
    """``Module.{path}.{Class}.parameters_grad.{k}``."""
    return f"{module_prefix(path, cls, list_index)}.{PARAMETERS_GRAD}.{index}"


def tensor_file(entry: str, category: str, index_path: Iterable[int | str]) -> str:
    """``{entry}.{category}.{index path}.pt``; ``category`` is input, kwargs, output or parameters."""
    parts = ".".join(str(p) for p in index_path)
    return f"{entry}.{category}.{parts}.pt" if parts else f"{entry}.{category}.pt"


def param_grad_file(entry: str, param: str) -> str:
    """``{Module...}.parameters_grad.{k}.{param}.pt``: parameter gradients carry no category."""
    return f"{entry}.{param}.pt"


def backward_of(forward_name: str) -> str:
    """The backward entry paired with a forward API or module entry name (built, not parsed: the client
    names each call's backward with it on the hot path)."""
    if forward_name.endswith(".forward"):
        return forward_name[: -len("forward")] + BACKWARD
    return forward_name.replace(".forward.", ".backward.")


@lru_cache(maxsize=1 << 16)
def parse_entry(name: str) -> EntryName | None:
    """Parse an entry name; None when it follows neither grammar. Cached: a compare asks for the same few
    thousand names many times."""
    if name.startswith("Module."):
        m = _GRAD_RE.match(name)
        if m:
            return EntryName(PARAMETERS_GRAD, "Module", m["path"], m["cls"], int(m["n"]), None, name)
        m = _MODULE_RE.match(name)
        if m:
            return EntryName("module", "Module", m["path"], m["cls"], int(m["n"]), m["dir"], name)
        return None
    m = _API_RE.match(name)
    if m:
        return EntryName("api", m["prefix"], m["api"], None, int(m["n"]), m["dir"], name)
    return None


def direction_of(name: str) -> str | None:
    """``forward`` or ``backward`` of an entry name; None for a parameter gradient or another grammar."""
    parsed = parse_entry(name)
    return parsed.direction if parsed is not None else None


def forward_of(name: str) -> str:
    """The forward entry of a call's entry (``X.3.backward`` → ``X.3.forward``; modules:
    ``M.backward.3`` → ``M.forward.3``); any other name as it is."""
    parsed = parse_entry(name)
    return parsed.forward if parsed is not None else name


def entry_op(name: str) -> str:
    """The op of an entry name (``EntryName.op``); a name of another grammar as it is."""
    parsed = parse_entry(name)
    return parsed.op if parsed is not None else name


def uncounted(name: str) -> str:
    """The name without its call counter (``EntryName.uncounted``); a name of another grammar as it is."""
    parsed = parse_entry(name)
    return parsed.uncounted if parsed is not None else name


def entry_family(name: str) -> str:
    """The calls of one kind (``EntryName.family``); a name of another grammar, its numbers dropped."""
    parsed = parse_entry(name)
    return parsed.family if parsed is not None else _NUMBER_PART.sub("", name)
