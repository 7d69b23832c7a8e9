"""Entry and tensor-file names of the msprobe layout (dump-format.md §3, §5), built and parsed in one place.

The client builds names with these helpers and the engine parses them back, so both sides agree on the
grammar: API entries put the counter *before* the direction (``Functional.linear.0.forward``), module
entries put it *after* (``Module.fc.Linear.forward.0``), parameter gradients are
``Module.fc.Linear.parameters_grad.0``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "API_PREFIXES",
    "EntryName",
    "api_entry",
    "backward_of",
    "module_entry",
    "module_prefix",
    "param_grad_entry",
    "param_grad_file",
    "parse_entry",
    "tensor_file",
]

#: msprobe's API prefixes (§5); ``Module`` entries are told apart by their own grammar.
API_PREFIXES = ("Functional", "Tensor", "Torch", "VF", "NPU", "Distributed", "MindSpeed", "Aten", "Triton")

FORWARD = "forward"
BACKWARD = "backward"

_API_RE = re.compile(r"^(?P<prefix>[^.]+)\.(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_MODULE_RE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward)\.(?P<n>\d+)$")
_GRAD_RE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.parameters_grad\.(?P<n>\d+)$")


@dataclass(frozen=True, slots=True)
class EntryName:
    """A parsed entry name. ``kind`` is ``api``, ``module`` or ``parameters_grad``; ``direction`` is None
    for parameter gradients."""

    kind: str
    prefix: str  # the API prefix, or "Module"
    name: str  # the API name, or the module path (with a list index when the model was a list)
    cls: str | None  # the module class name; None for APIs
    index: int
    direction: str | None


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
    return f"{module_prefix(path, cls, list_index)}.parameters_grad.{index}"


def tensor_file(entry: str, category: str, index_path: Iterable[int | str]) -> str:
    """``{entry}.{category}.{index path}.pt``; ``category`` is input, kwargs, output or parameters."""
    parts = ".".join(str(p) for p in index_path)
    return f"{entry}.{category}.{parts}.pt" if parts else f"{entry}.{category}.pt"


def param_grad_file(entry: str, param: str) -> str:
    """``{Module...}.parameters_grad.{k}.{param}.pt``: parameter gradients carry no category."""
    return f"{entry}.{param}.pt"


def backward_of(forward_name: str) -> str:
    """The backward entry paired with a forward API or module entry name."""
    if forward_name.endswith(".forward"):
        return forward_name[: -len("forward")] + BACKWARD
    return forward_name.replace(".forward.", ".backward.")


def parse_entry(name: str) -> EntryName | None:
    """Parse an entry name; None when it follows neither grammar."""
    if name.startswith("Module."):
        m = _GRAD_RE.match(name)
        if m:
            return EntryName("parameters_grad", "Module", m["path"], m["cls"], int(m["n"]), None)
        m = _MODULE_RE.match(name)
        if m:
            return EntryName("module", "Module", m["path"], m["cls"], int(m["n"]), m["dir"])
        return None
    m = _API_RE.match(name)
    if m:
        return EntryName("api", m["prefix"], m["api"], None, int(m["n"]), m["dir"])
    return None
