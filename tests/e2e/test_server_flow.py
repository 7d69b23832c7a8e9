"""The client against a real ``parity server``: uploads from training, resumed uploads, comparisons."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import openpyxl
import pytest
from parity.client.rest import ParityClient
from parity.client.uploader import BackgroundUploader
from parity.server.settings import Settings

from parity.cli import main
from parity.demo import ServerProcess
from tests.e2e.conftest import local_files, write_model_dump
from tests.factories import DumpBuilder
from tests.workers import validation_thread

pytestmark = pytest.mark.timeout(300)


def upload_with_client(server: str, root: Path, name: str, ranks: tuple[int, ...]) -> BackgroundUploader:
    """What the debugger does: hand each flushed rank dir to the uploader, then close it at exit."""
    up = BackgroundUploader(server, run_name=name, project="e2e", tags={"suite": "e2e"})
    for rank in ranks:
        up.submit_rank_dir(0, rank, root / "step0" / f"rank{rank}")
    up.close(timeout=60)
    return up


def test_demo_flow_two_uploads_compare_download(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bench_root = write_model_dump(tmp_path / "gpu")
    target_root = write_model_dump(tmp_path / "npu", gelu_noise=1e-2)
    bench = upload_with_client(server.url, bench_root, f"gpu-{unique}", (0,))
    target = upload_with_client(server.url, target_root, f"npu-{unique}", (0,))
    for up, root in ((bench, bench_root), (target, target_root)):
        assert up.run is not None and up.run.status == "complete", up.stats
        stored = {f.path for f in api.list_files(up.run.id)}
        assert stored == local_files(root)
        assert up.run.metadata["torch_version"] and up.run.tags == {"suite": "e2e"}

    out_dir = tmp_path / "out"
    argv = [
        "compare-runs",
        f"npu-{unique}",
        f"gpu-{unique}",
        "--server",
        server.url,
        "--wait",
        "-o",
        str(out_dir),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # the advisor file's own wording (one formatter), each suspect naming its rank
    assert "Top suspects, by how far they stand above the background" in printed
    first = r"^1\. \[forward\] Functional\.gelu\.0\.forward \(score [\d.]+, rank 0, Excel row \d+\): "
    assert re.search(first, printed, re.MULTILINE)

    (comparison,) = api.list_comparisons(run=target.run_id)[0]
    summary = comparison.summary
    assert comparison.status == "succeeded" and summary is not None
    assert summary.top_suspects[0].api == "Functional.gelu.0.forward"
    rows = api.comparison_rows(comparison.id, limit=1000)
    assert rows.count == summary.rows == len(rows.data) > 0
    failing = api.comparison_rows(comparison.id, failing=True, limit=1000)
    assert failing.count == summary.failing_rows > 0

    xlsx = next(out_dir.glob("compare_result_*.xlsx"))
    advisor = next(out_dir.glob("advisor_*.txt"))
    sheet = openpyxl.load_workbook(xlsx, read_only=True).worksheets[0]
    table = list(sheet.iter_rows(values_only=True))
    assert list(table[0][: len(rows.header)]) == rows.header
    assert len(table) - 1 == summary.rows
    assert "Functional.gelu.0.forward" in advisor.read_text()


def test_upload_resumes_after_sigkill_without_duplicates(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str
) -> None:
    root = tmp_path / "dump"
    rng = np.random.default_rng(0)
    for rank in (0, 1):
        b = DumpBuilder("tensor")
        for i in range(120):
            b.api(f"Torch.add.{i}.forward", [rng.standard_normal(4096).astype(np.float32)], [])
        b.write(root / "step0" / f"rank{rank}")
    name = f"resume-{unique}"
    cmd = [sys.executable, "-m", "parity", "upload", str(root), "--server", server.url, "--name", name,
           "--project", "e2e", "--jobs", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run_id = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        runs = api.find_runs(name=name, project="e2e")
        if runs:
            run_id = runs[0].id
            if len(api.list_files(run_id)) >= 10:
                break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the upload finished before it could be interrupted"
    assert run_id is not None
    partial = {f.path for f in api.list_files(run_id)}
    assert 10 <= len(partial) < len(local_files(root))
    assert api.get_run(run_id).status == "uploading"

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == run_id  # the same run was finished, not a new one
    runs = api.find_runs(name=name, project="e2e")
    assert [r.id for r in runs] == [run_id]
    files = api.list_files(run_id)
    paths = [f.path for f in files]
    assert len(paths) == len(set(paths)) and set(paths) == local_files(root)
    run = api.get_run(run_id)
    assert run.status == "complete" and run.file_count == len(paths) and run.ranks == [0, 1]


def test_sixteen_concurrent_uploaders(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str
) -> None:
    roots = [write_model_dump(tmp_path / f"d{i}", ranks=(0, 1), gelu_noise=i * 1e-3) for i in range(16)]
    uploaders: list[BackgroundUploader] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            uploaders.append(upload_with_client(server.url, roots[i], f"conc{i}-{unique}", (0, 1)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(uploaders) == 16
    for up in uploaders:
        assert up.stats.files_failed == 0 and up.stats.errors == [], up.stats
        assert up.run is not None and up.run.status == "complete"
        i = int(up.run.name[4:].split("-")[0])
        stored = {f.path: f.sha256 for f in api.list_files(up.run.id)}
        assert set(stored) == local_files(roots[i])
        assert up.run.file_count == len(stored)


def test_commands_send_the_token(tmp_path: Path, unique: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_model_dump(tmp_path / "dump")
    with ServerProcess(
        tmp_path / "data", env={"PARITY_TOKENS": "rw-tok,ro-tok:ro", "PARITY_WORKERS": "0"}
    ) as srv, validation_thread(Settings(data_dir=tmp_path / "data")):  # the one worker, in this process
        base = ["upload", str(root), "--server", srv.url, "--name", f"tok-{unique}"]
        assert main(base) == 2
        assert "HTTP 401" in capsys.readouterr().err
        assert main([*base, "--token", "ro-tok"]) == 2
        assert "HTTP 403" in capsys.readouterr().err
        assert main([*base, "--token", "rw-tok"]) == 0
        with ParityClient(srv.url, token="ro-tok") as ro:
            (run,) = ro.find_runs(name=f"tok-{unique}")
            assert run.status == "complete"


TRAIN_WITHOUT_FINAL_STEP = """
import sys
import torch
from parity import PrecisionDebugger
dump, url, name = sys.argv[1:4]
debugger = PrecisionDebugger(task="statistics", dump_path=dump, level="L1", server=url, run_name=name,
                             project="e2e")
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
for step in range(2):
    debugger.start(model)
    model(torch.ones(2, 4)).sum().backward()
    debugger.stop()
    if step == 0:
        debugger.step()  # step 0 is uploaded while training runs (the uploader starts here)
# no step() after the last stop(): the debugger's exit hook flushes step 1, and only then may the uploader
# complete the run
"""


def test_debugger_uploads_the_step_flushed_at_exit(
    server: ServerProcess, api: ParityClient, tmp_path: Path, unique: str
) -> None:
    name = f"exit-flush-{unique}"
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_WITHOUT_FINAL_STEP, str(tmp_path / "dump"), server.url, name],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    (run,) = api.find_runs(name=name, project="e2e")
    assert run.status == "complete" and run.steps == [0, 1]
    assert {f.path for f in api.list_files(run.id)} == local_files(tmp_path / "dump")
