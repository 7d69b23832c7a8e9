"""msprobe itself, run in subprocesses from its own venv (``make msprobe-venv``: mindstudio-probe 8.3.3).

Locally a missing venv skips these tests with the command that builds it; in CI (``CI=true``) it fails them,
so the interoperability checks never disappear quietly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: built by ``make msprobe-venv``; PARITY_MSPROBE_VENV points the tests at another one
MSPROBE_VENV = Path(os.environ.get("PARITY_MSPROBE_VENV") or ROOT / ".venv-msprobe")
#: msprobe 26.2.0's, built by ``make msprobe26-venv``; PARITY_MSPROBE26_VENV points the tests at another one
MSPROBE26_VENV = Path(os.environ.get("PARITY_MSPROBE26_VENV") or ROOT / ".venv-msprobe26")
TRAIN = Path(__file__).with_name("train_model.py")
TIMEOUT = 300


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def _venv_bin(venv: Path, target: str) -> Path:
    python = venv / "bin" / "python"
    if not python.is_file():
        message = f"{venv} is missing: run `make {target}` (make test builds it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python.parent


@pytest.fixture(scope="session")
def msprobe_bin() -> Path:
    """The msprobe 8.3.3 venv's bin directory."""
    return _venv_bin(MSPROBE_VENV, "msprobe-venv")


@pytest.fixture(scope="session")
def msprobe26_bin() -> Path:
    """The msprobe 26.2.0 venv's bin directory."""
    return _venv_bin(MSPROBE26_VENV, "msprobe26-venv")


def run_tool(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one of the tools, failing the test with its output when it exits non-zero."""
    return _run(cmd, cwd)


@pytest.fixture(scope="session")
def dump(msprobe_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``dump(tool, task, perturb=False)``: the model's dump.json written by ``tool`` (cached per session)."""
    root = tmp_path_factory.mktemp("dumps")
    made: dict[tuple[str, str, bool], Path] = {}

    def make(tool: str, task: str, perturb: bool = False) -> Path:
        key = (tool, task, perturb)
        if key not in made:
            out = root / f"{tool}-{task}-{'perturbed' if perturb else 'plain'}"
            python = msprobe_bin / "python" if tool == "msprobe" else Path(sys.executable)
            _run([str(python), str(TRAIN), tool, task, str(out), *(["perturb"] if perturb else [])], root)
            found = sorted(out.glob("step0/rank*/dump.json"))
            assert len(found) == 1, found
            made[key] = found[0]
        return made[key]

    return make


def _spec(tmp: Path, npu: Path, bench: Path) -> Path:
    spec = tmp / "compare.json"
    spec.write_text(
        json.dumps({"npu_path": str(npu), "bench_path": str(bench), "is_print_compare_log": False})
    )
    return spec


@pytest.fixture
def msprobe_compare(msprobe_bin: Path, tmp_path: Path) -> Callable[..., Path]:
    """``msprobe_compare(npu, bench)``: msprobe 8.3.3's ``compare -hl`` of two dump.json; its xlsx."""

    def run(npu: Path, bench: Path) -> Path:
        out = tmp_path / "msprobe-out"
        spec = _spec(tmp_path, npu, bench)
        command = [str(msprobe_bin / "msprobe"), "-f", "pytorch", "compare", "-i", str(spec), "-o", str(out)]
        _run([*command, "-hl"], tmp_path)
        (xlsx,) = out.glob("compare_result_*.xlsx")
        return xlsx

    return run


@pytest.fixture
def parity_compare(tmp_path: Path) -> Callable[..., Path]:
    """``parity_compare(npu, bench)``: ``parity compare`` of two dump.json; its output directory."""

    def run(npu: Path, bench: Path) -> Path:
        out = tmp_path / "parity-out"
        spec = _spec(tmp_path, npu, bench)
        _run([sys.executable, "-m", "parity", "compare", "-i", str(spec), "-o", str(out), "--no-progress"],
             tmp_path)  # fmt: skip
        return out

    return run
