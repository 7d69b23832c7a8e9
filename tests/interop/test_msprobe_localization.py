"""The localization suite dumped by msprobe 8.3.3 itself (``bench_localization.py --dumper msprobe``, the
issue's held-out judge): msprobe's ``PrecisionDebugger`` records a real training step in its own venv, one
call degraded in the target run, and Parity's engine names that call from msprobe's dump order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TIMEOUT = 300
sys.path.insert(0, str(BENCHMARKS))

import localization_suite as suite  # noqa: E402


def _msprobe_dump(msprobe_bin: Path, out: Path, family: str, fault: suite.Fault | None, sigma: float) -> Path:
    command = [str(msprobe_bin / "python"), str(BENCHMARKS / "msprobe_case.py"), str(out), family, "tensor",
               fault.label if fault else "-", repr(sigma), "3"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def test_faults_in_noisy_msprobe_dumps_are_named(msprobe_bin: Path, tmp_path: Path) -> None:
    """Every call carries 1e-5 noise. ReLU's backward with 1e-3 gradient noise (the routed-gradient rule)
    and the third ``linear`` without its bias (a call counted past its first, so the fault lands where
    msprobe's counter says) are each named first; the noise alone names nothing."""
    bench = _msprobe_dump(msprobe_bin, tmp_path / "bench", "mlp", None, 0.0)
    for fault in (suite.Fault("mlp", "Functional.relu", 0, "bwd-noise-1e-3"),
                  suite.Fault("mlp", "Functional.linear", 2, "no-bias")):  # fmt: skip
        target = _msprobe_dump(msprobe_bin, tmp_path / fault.kind, "mlp", fault, 1e-5)
        ranked, first, _ = suite.compare(target, bench)
        assert ranked[:1] == [fault.entry] and first == fault.entry, fault.label
    noisy = _msprobe_dump(msprobe_bin, tmp_path / "noisy", "mlp", None, 1e-5)
    assert suite.compare(noisy, bench)[:2] == ([], None)
