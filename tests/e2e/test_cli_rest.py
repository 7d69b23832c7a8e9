"""The commands against a real server, in the REST API's words: ``parity upload``'s progress and ``--quiet``
(and no line per file), an upload under a taken name (no-op or refused), ``parity runs list|delete`` with
``--tag KEY=VALUE`` and ``--with-comparisons``, and the summary JSON ``compare-runs --wait`` downloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from parity.client.rest import ParityClient

from parity.cli import main
from parity.demo import ServerProcess
from tests.e2e.conftest import write_model_dump
from tests.factories import DumpBuilder

pytestmark = pytest.mark.timeout(300)


def many_files_dump(root: Path, apis: int = 40) -> Path:
    """A tensor dump of ``apis`` entries: one tensor file each, so a line per file would show."""
    rng = np.random.default_rng(3)
    b = DumpBuilder("tensor")
    for i in range(apis):
        b.api(f"Torch.add.{i}.forward", [rng.standard_normal(256).astype(np.float32)], [])
    b.write(root / "step0" / "rank0")
    return root


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``parity ARGS`` in a process of its own, as a user runs it (its logging set up by the command)."""
    return subprocess.run([sys.executable, "-m", "parity", *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_upload_shows_a_few_progress_lines_and_quiet_shows_none(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str
) -> None:
    root = many_files_dump(tmp_path / "dump")
    files = len([p for p in root.rglob("*") if p.is_file()])
    done = cli("upload", str(root), "--server", server.url, "--name", f"progress-{unique}")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    # Off a terminal: a line per tenth of the bytes at most, then the summary; never a line per file.
    assert not [line for line in lines if "HTTP Request" in line or "PUT " in line], lines
    assert len(lines) <= 14 < files, lines
    assert any(line.startswith(f"parity upload: 100% ({files}/{files} files,") for line in lines), lines
    assert f"complete: {files} files" in lines[-1]

    quiet = cli("upload", str(many_files_dump(tmp_path / "dump2", apis=5)), "--server", server.url,
                "--name", f"quiet-{unique}", "-q")  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert api.get_run(quiet.stdout.strip()).status == "complete"


def test_an_upload_under_a_taken_name_is_a_noop_or_refused(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_model_dump(tmp_path / "dump")
    name = f"taken-{unique}"
    args = ["upload", str(root), "--server", server.url, "--name", name, "--project", "e2e"]
    assert main(args) == 0
    run_id = capsys.readouterr().out.strip()
    stored = api.list_files(run_id)
    # The same dump again: nothing is sent, the same run is the answer.
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == run_id
    # Another dump under that name: refused, naming what differs and what to do.
    (root / "step0" / "rank0" / "extra.json").write_text("{}")
    dump_json = root / "step0" / "rank0" / "dump.json"
    dump_json.write_text(dump_json.read_text().replace("gelu", "relu"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"run {run_id} ('{name}' in project 'e2e') is complete and holds another dump" in err
    assert "1 file(s) differ (step0/rank0/dump.json)" in err
    assert "1 file(s) only here (step0/rank0/extra.json)" in err
    assert f"parity runs delete {name} --project e2e --with-comparisons" in err
    assert [r.id for r in api.find_runs(name=name, project="e2e")] == [run_id]
    assert api.list_files(run_id) == stored


def test_runs_commands_and_compare_runs_speak_the_rest_api(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--server", server.url]
    for side, noise in (("npu", 0.3), ("gpu", 0.0)):
        root = write_model_dump(tmp_path / side, gelu_noise=noise)
        assert main(["upload", str(root), *base, "--name", f"{side}-{unique}", "--tag", f"side={side}",
                     "--tag", f"suite=cli-{unique}"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["runs", "list", *base, "--tag", f"suite=cli-{unique}", "--tag", "side=npu"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["RUN", "AGAINST", "BASELINE", "STATUS"]
    cells = line.split()
    assert cells[:3] == [f"default/npu-{unique}", "not", "compared"] and cells[3] == "complete", line
    assert "side=npu" in line
    assert main(["runs", "list", *base, "--name-contains", f"GPU-{unique.upper()}"]) == 0
    assert f"default/gpu-{unique}  " in capsys.readouterr().out

    out = tmp_path / "reports"
    assert main(["compare-runs", f"npu-{unique}", f"gpu-{unique}", *base, "--wait", "-o", str(out)]) == 0
    (summary,) = out.glob("compare_summary_*.json")
    assert json.loads(summary.read_text())["compared_ranks"] == [0]
    assert len(list(out.glob("compare_result_*.xlsx"))) == 1
    capsys.readouterr()

    # The target run is used by that comparison: deleting it needs the flag.
    assert main(["runs", "delete", f"npu-{unique}", *base]) == 2
    err = capsys.readouterr().err
    assert "used by 1 comparison(s)" in err and "--with-comparisons" in err
    assert api.find_runs(name=f"npu-{unique}")[0].status == "complete"
    assert main(["runs", "delete", f"npu-{unique}", *base, "--with-comparisons"]) == 0
    assert api.find_runs(name=f"npu-{unique}") == []
    assert api.list_comparisons(run=f"gpu-{unique}")[1] == 0
    assert main(["runs", "delete", f"gpu-{unique}", *base]) == 0
