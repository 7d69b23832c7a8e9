"""A truthful schema (issue 12): schemathesis against a live ``parity server`` (uvicorn, SQLite), every
phase (explicit examples, boundary coverage, fuzzing, stateful sequences through the inferred links), a
bounded number of examples per operation and a fixed seed, with the checks that make the schema the truth:
no 5xx, no status, content type, header or body the schema does not declare."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import ServerProcess

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_headers_conformance", "response_schema_conformance",
])  # fmt: skip
#: Examples per operation and phase: ~600 requests in about 40 s on a quiet 2-core machine.
MAX_EXAMPLES = 5


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", {"PARITY_WORKERS": "0"}).start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{srv.url}/openapi.json", "--checks", CHECKS,
             "--max-examples", str(MAX_EXAMPLES), "--seed", "12", "--workers", "1", "--no-color",
             "--generation-database", "none", "--report", "junit", "--report-dir", str(tmp_path / "report")],
            capture_output=True, text=True, timeout=540, cwd=tmp_path,
        )  # fmt: skip
    finally:
        srv.stop()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    summary = re.search(r"(\d+) generated, (\d+) passed", out)
    assert summary is not None, out[-3000:]
    generated, passed = map(int, summary.groups())
    assert generated == passed and generated > 100
    assert "Internal Server Error" not in srv.log()
    print(f"\nschemathesis: {generated} generated, {passed} passed, 0 server errors, 0 schema violations")
