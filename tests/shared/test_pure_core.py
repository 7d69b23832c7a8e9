"""``parity.shared`` is a pure library: no process, thread, pool, exit hook or collector policy of its own.

Pools belong to the entry points (``parity.process_policy``), which hand them in; the checks below read the
source (what is imported at module level, what is called anywhere), and import the core in a fresh
interpreter to see what it drags in.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
#: modules that start or steer processes and threads: an entry point's business
PROCESS_MODULES = frozenset({"multiprocessing", "concurrent", "threading", "atexit", "subprocess", "signal"})
#: calls that change what the whole process does
PROCESS_CALLS = frozenset({
    "gc.disable", "gc.enable", "gc.freeze", "gc.unfreeze", "os.fork", "os.register_at_fork",
    "atexit.register", "set_start_method", "set_forkserver_preload",
})  # fmt: skip


def _sources() -> list[Path]:
    files = sorted(SHARED.rglob("*.py"))
    assert len(files) > 20  # the walk found the package
    return files


def _module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Imports run when the module is imported: top level and its ``try``/``if``, not ``if TYPE_CHECKING``."""
    found: list[tuple[int, str]] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                todo += handler.body
    return found


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SHARED)))
def test_no_process_machinery_imported_at_module_level(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    imports = _module_level_imports(tree)
    bad = [(line, name) for line, name in imports if name.split(".")[0] in PROCESS_MODULES]
    assert not bad, f"{path}: imports {bad} at module level (pools are handed in by the entry points)"


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SHARED)))
def test_no_process_wide_policy_anywhere(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    calls = [_dotted(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    bad = [c for c in calls if c in PROCESS_CALLS or c.rsplit(".", 1)[-1] in PROCESS_CALLS]
    assert not bad, f"{path}: calls {bad} (process policy lives in parity.process_policy)"


def test_the_checks_see_what_they_look_for() -> None:
    """The two checks above on a module that breaks both rules (a check that cannot fail proves nothing)."""
    tree = ast.parse(
        "import gc\nfrom typing import TYPE_CHECKING\ntry:\n    import multiprocessing\nexcept ImportError:\n"
        "    pass\nif TYPE_CHECKING:\n    from concurrent.futures import Executor\n"
        "def f():\n    from concurrent.futures import wait\n    gc.disable()\n"
    )
    assert [name for _, name in _module_level_imports(tree)
            if name.split(".")[0] in PROCESS_MODULES] == ["multiprocessing"]  # fmt: skip
    assert "gc.disable" in [_dotted(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_importing_the_engine_starts_nothing_and_loads_no_pool_or_numba() -> None:
    """Importing the compare engine and the tensor metrics leaves the process as it was: no thread, no pool
    modules, and no numba (imported only for a tensor pair large enough to need the compiled kernel)."""
    code = (
        "import sys, threading\n"
        "import parity.shared.compare.engine, parity.shared.compare.job, parity.shared.metrics.parallel\n"
        "import parity.shared.dump.sidecar\n"
        "loaded = sorted(m for m in ('numba', 'multiprocessing', 'concurrent.futures') if m in sys.modules)\n"
        "print(threading.active_count(), loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "[]"], out
