"""YAML from a user's file (``-dm``, ``-cm``) read as untrusted input: nesting and alias expansion bounded.

PyYAML's safe loader refuses tags that build objects, but not the two ways a few hundred bytes become
gigabytes: aliases of aliases (a "billion laughs" document, whose value is shared in memory but expanded by
whatever prints or walks it) and deep nesting (an uncaught ``RecursionError`` in the composer). Here the
composer counts both as it goes: past ``MAX_DEPTH`` levels or ``MAX_NODES`` nodes *as expanded* (each alias
counting the whole subtree it stands for), the file is refused before any value is built.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import Node

__all__ = ["MAX_DEPTH", "MAX_NODES", "YamlTooLarge", "load_bounded"]

#: deeper than any mapping file (they are flat); far below Python's recursion limit
MAX_DEPTH = 64
#: nodes once aliases are expanded: a mapping file of 100,000 pairs is 200,001
MAX_NODES = 1_000_000


class YamlTooLarge(yaml.YAMLError):
    """A document past the nesting or expansion budget; ``problem`` says which, without the values."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._expanded = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes in its expansion

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlTooLarge(f"nested deeper than {MAX_DEPTH} levels", mark)
        before = self._expanded
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._count(1, mark)
        if node is not None:
            self._sizes[id(node)] = self._expanded - before
        return node

    def _count(self, nodes: int, mark: yaml.Mark) -> None:
        self._expanded += nodes
        if self._expanded > MAX_NODES:
            raise YamlTooLarge(f"expands to more than {MAX_NODES:,} values (aliases of aliases?)", mark)


def load_bounded(text: str) -> Any:
    """``yaml.safe_load(text)`` within the nesting and expansion budget (:class:`YamlTooLarge` past it)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
