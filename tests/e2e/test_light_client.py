"""The light client: what ``pip install parity`` brings is enough to capture a step and upload it.

A fresh venv per test run would cost a torch install; instead the training script runs in a subprocess where
every module that only an extra brings (numba, the xlsx writers, orjson, FastAPI, SQLAlchemy, Celery...)
cannot be imported, as in a venv without them. The blocked set is read from pyproject.toml, so a dependency
moved into an extra is blocked here at once; the second test keeps the CLI's advice table in step with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from parity.client.rest import ParityClient

from parity.demo import ServerProcess
from parity.errors import EXTRA_OF_MODULE
from tests.e2e.conftest import local_files

REPO = Path(__file__).resolve().parents[2]
HEAVY_EXTRAS = ("compare", "server", "celery", "postgres")
#: Packages of an extra that nothing imports by name (uvicorn picks them up itself when present).
NOT_IMPORTED = {"httptools", "uvloop"}

pytestmark = pytest.mark.timeout(300)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("-", "_")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def extra_modules() -> dict[str, str]:
    """``{import name: extra}`` for every package that only a heavy extra lists (``parity[...]`` aside)."""
    project = _pyproject()["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    found: dict[str, str] = {}
    for extra in HEAVY_EXTRAS:
        for requirement in project["optional-dependencies"][extra]:
            name = _requirement_name(requirement)
            if name != "parity" and name not in base and name not in NOT_IMPORTED:
                found.setdefault(name, extra)
    return found


LIGHT_TRAINING = r"""
import importlib.abc
import sys

BLOCKED = set(sys.argv[1].split(","))


class NotInstalled(importlib.abc.MetaPathFinder):
    '''Every module of a heavy extra is missing, as in a venv with only the base install.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())

import torch
from parity.client import PrecisionDebugger
from parity.cli import main

dump, url, name = sys.argv[2:5]
debugger = PrecisionDebugger(task="tensor", dump_path=dump, level="L1", server=url, run_name=name,
                             project="light")
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
debugger.start(model)
model(torch.ones(2, 4)).sum().backward()
debugger.stop()
debugger.step()

assert main(["upload", dump, "--server", url, "--name", name + "-cli", "--project", "light"]) == 0
import json, pathlib
dump_json = str(pathlib.Path(dump, "step0", "rank0", "dump.json"))
pathlib.Path("compare.json").write_text(json.dumps({"npu_path": dump_json, "bench_path": dump_json}))
assert main(["compare", "-i", "compare.json", "-o", "out"]) == 2  # the compare engine is an extra
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
"""


def test_capture_and_upload_without_any_extra(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str
) -> None:
    blocked = sorted(extra_modules())
    assert {"numba", "openpyxl", "xlsxwriter", "fastapi", "sqlalchemy"} <= set(blocked)
    name = f"light-{unique}"
    dump = tmp_path / "dump"
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_TRAINING, ",".join(blocked), str(dump), server.url, name],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "parity compare: error: needs the [compare] extra" in done.stderr
    assert "pip install 'parity[compare]'" in done.stderr
    for run_name in (name, f"{name}-cli"):
        (run,) = api.find_runs(name=run_name, project="light")
        assert run.status == "complete" and run.steps == [0], run
        assert {f.path for f in api.list_files(run.id)} == local_files(dump)
        assert any(p.endswith(".pt") for p in local_files(dump))


def test_the_cli_advice_table_matches_pyproject() -> None:
    from_pyproject = extra_modules()
    assert {m: e for m, e in EXTRA_OF_MODULE.items() if m in from_pyproject} == from_pyproject
    assert set(EXTRA_OF_MODULE) - set(from_pyproject) <= {"starlette"}  # FastAPI's own dependency


def test_the_base_install_is_light() -> None:
    base = {_requirement_name(r) for r in _pyproject()["project"]["dependencies"]}
    assert base == {"torch", "numpy", "pydantic", "httpx"}
