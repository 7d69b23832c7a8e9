"""The layer contracts of ``parity``, checked over its import graph (every import, lazy ones included).

* ``parity.shared`` imports neither ``parity.client`` nor ``parity.server``;
* nothing imports ``parity.commands`` but the CLI entry (``parity.cli``) and the commands themselves;
* ``parity.server.jobs`` imports the services, never the reverse: a service reaches the job backends only
  through ``parity.server.jobs.base`` (the ``JobQueue`` protocol and the job ids), which imports nothing of
  the server;
* no import cycle anywhere.

The graph is read from the source with :mod:`ast` (the package folders of :data:`PACKAGES`), so a
function-level import counts as much as a top-level one: a cycle through a lazy import is still a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


#: The installed packages and their folders (pyproject.toml maps them so).
PACKAGES = {"parity": "parity", "parity.client": "client", "parity.server": "server",
            "parity.shared": "shared"}  # fmt: skip


def _modules() -> dict[str, Path]:
    """Every module of ``parity`` by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for package, name in PACKAGES.items():
        folder = ROOT / name
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p.startswith(".") or p == "versions" for p in parts):
                continue  # migration scripts are loaded by Alembic, not imported
            out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The ``parity`` modules ``name`` imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("parity"):
                yield target


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set(_imports(name, path, modules)) for name, path in modules.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _offending(graph: dict[str, set[str]], importer: str, imported: str) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if _within(a, importer)
        for b in targets
        if _within(b, imported)
    )


def test_the_graph_sees_every_layer(graph: dict[str, set[str]]) -> None:
    for package in (*PACKAGES, "parity.commands", "parity.server.jobs"):
        assert any(_within(m, package) for m in graph), f"{package} not found: the test reads no source"
    assert "parity.server.jobs.base" in graph["parity.server.services.comparisons"]


def test_shared_imports_neither_client_nor_server(graph: dict[str, set[str]]) -> None:
    assert _offending(graph, "parity.shared", "parity.client") == []
    assert _offending(graph, "parity.shared", "parity.server") == []


def test_nothing_imports_the_commands_but_the_cli(graph: dict[str, set[str]]) -> None:
    found = [
        line
        for line in _offending(graph, "parity", "parity.commands")
        if not line.startswith(("parity.cli ", "parity.commands"))
    ]
    assert found == []


def test_the_services_reach_the_jobs_only_through_their_base(graph: dict[str, set[str]]) -> None:
    found = [line for line in _offending(graph, "parity.server.services", "parity.server.jobs")
             if not line.endswith(" -> parity.server.jobs.base")]  # fmt: skip
    assert found == []
    for below in ("parity.server.repositories", "parity.server.job_repository", "parity.server.models"):
        found = [line for line in _offending(graph, below, "parity.server.jobs")
                 if not line.endswith(" -> parity.server.jobs.base")]  # fmt: skip
        assert found == []
    # the protocol and the ids below everything: the base imports nothing of the server
    assert sorted(b for b in graph["parity.server.jobs.base"] if _within(b, "parity.server")) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _without_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph less the edges from a module to the packages above it: importing ``a.b.c`` runs ``a`` and
    ``a.b`` first in any case, so ``a.b.c -> a.b`` closes no cycle that matters (a package's ``__init__``
    re-exporting its modules is the usual case)."""
    return {m: {t for t in targets if not _within(m, t)} for m, targets in graph.items()}


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    assert _cycles(_without_parents(graph)) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(ring) == [["a", "b", "c"]]
