"""The light client: what ``pip install parity`` brings is enough to capture a step and upload it.

The test builds a fresh venv (no pip, no system site-packages) that sees only the distributions the base
install resolves to: torch, numpy, pydantic, httpx and what they require, found through their metadata and
linked in from the test's own environment (so nothing is downloaded or copied), plus this checkout. A
training script in that venv captures a tensor-mode step and uploads it to a real ``parity server``, runs
``parity upload``, and gets the one-line advice from ``parity compare``. The heavy extras' modules are read
from pyproject.toml; the last tests keep the CLI's advice table and the base list in step with it.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
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


def _import_names(distribution: str) -> list[str]:
    """The top-level modules an installed distribution provides (``swagger-ui-bundle-v2`` gives
    ``swagger_ui_bundle``); its own name in import form when it is not installed here."""
    wanted = canonicalize_name(distribution)
    names = [
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if wanted in {canonicalize_name(d) for d in dists} and module.isidentifier() and module[0] != "_"
    ]
    return sorted(names) or [wanted.replace("-", "_")]


def extra_modules() -> dict[str, str]:
    """``{import name: extra}`` for every package that only a heavy extra lists (``parity[...]`` aside)."""
    project = _pyproject()["project"]
    # what the base install brings anyway (jinja2 comes with torch) is not the extra's to bring
    base = {canonicalize_name(d.metadata["Name"]) for d in base_closure()}
    found: dict[str, str] = {}
    for extra in HEAVY_EXTRAS:
        for requirement in project["optional-dependencies"][extra]:
            name = _requirement_name(requirement)
            if name != "parity" and canonicalize_name(name) not in base and name not in NOT_IMPORTED:
                for module in _import_names(name):
                    found.setdefault(module, extra)
    return found


def base_closure() -> list[importlib.metadata.Distribution]:
    """The installed distributions that ``pip install parity`` (no extra) resolves to, found by metadata."""
    todo = [_requirement_name(r) for r in _pyproject()["project"]["dependencies"]]
    found: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found[name] = dist = importlib.metadata.distribution(name)
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def light_venv(where: Path) -> Path:
    """A venv whose only packages are the base install's (linked from this environment) and this checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    packages = where / "light-packages"
    packages.mkdir()
    for dist in base_closure():
        site = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or () if not f.parts[0].startswith("..")}:
            if not top.endswith(".pth") and top != "__pycache__" and not (packages / top).exists():
                (packages / top).symlink_to(site / top)
    (site_packages,) = where.glob("lib/python*/site-packages")
    (site_packages / "light.pth").write_text(f"{packages}\n{REPO}\n")
    return where / "bin" / "python"


LIGHT_TRAINING = r"""
import importlib.util
import json
import pathlib
import sys

heavy = sys.argv[1].split(",")
present = [m for m in heavy if importlib.util.find_spec(m) is not None]
assert not present, f"the light venv has {present}"

import torch
from parity.client import ParityClient, PrecisionDebugger, upload_dump  # the upload names need no torch
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
dump_json = str(pathlib.Path(dump, "step0", "rank0", "dump.json"))
pathlib.Path("compare.json").write_text(json.dumps({"npu_path": dump_json, "bench_path": dump_json}))
assert main(["compare", "-i", "compare.json", "-o", "out"]) == 2  # the compare engine is an extra
"""


def test_capture_and_upload_in_a_venv_with_only_the_base_install(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str
) -> None:
    heavy = sorted(extra_modules())
    assert {"numba", "openpyxl", "xlsxwriter", "fastapi", "sqlalchemy"} <= set(heavy)
    python = light_venv(tmp_path / "venv")
    name = f"light-{unique}"
    dump = tmp_path / "dump"
    done = subprocess.run(
        [str(python), "-c", LIGHT_TRAINING, ",".join(heavy), str(dump), server.url, name],
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
    assert base == {"torch", "numpy", "pydantic", "httpx", "tenacity"}  # tenacity: pure Python, no dependency
