"""A training job whose Parity server is down: training finishes, the dump stays on disk, and the warning at
exit names every step not uploaded with the ``parity upload`` command that sends them.

Two ways to be down: a server that goes away while the job runs (the uploader's retries, cut short at exit),
and one that gives no answer from the start (the debugger's check before training turns uploads off, so the
job makes no other request). No test asserts on time: they count the requests made and read the limits set.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from parity.client import debugger as debugger_module
from parity.client.run_metadata import detect_device

from parity.demo import free_port

REPO = Path(__file__).resolve().parents[2]

TRAINING = """
import logging, sys
from pathlib import Path
import numpy as np
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from parity.client.uploader import BackgroundUploader
from tests.factories import DumpBuilder

root, url = Path(sys.argv[1]), sys.argv[2]
# the retry budget well inside the 1 s the uploader is given at exit, so the warning says why it gave up
uploader = BackgroundUploader(url, run_name="down", retry_budget_s=0.2, initial_backoff_s=0.05)
x = np.ones((2, 2), dtype=np.float32)
for step in range(3):
    rank_dir = root / f"step{step}" / "rank0"
    DumpBuilder("tensor").api("Torch.mul.0.forward", [x * step, x], [x * step]).write(rank_dir)
    uploader.submit_rank_dir(step, 0, rank_dir)
print("training finished")
# no close(): the uploader's atexit hook drains and gives up on its own
"""


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("WARNING parity.client.uploader")]


def test_server_down_does_not_fail_training(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-c", TRAINING, str(tmp_path / "dump"), url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "training finished"
    first, at_exit = _warnings(done.stderr)
    assert "could not create the run" in first and "server unreachable" in first
    assert f"steps 0-2 (rank 0) not uploaded to {url}: could not create the run" in at_exit
    command = done.stderr.split("to upload it:\n", 1)[1].splitlines()[0].strip()
    # the command is one line, as a user would paste it
    expected = f"parity upload {tmp_path / 'dump'} --server {url} --name down --project default --device "
    assert command.startswith(expected)
    assert "Traceback" not in done.stderr
    for step in range(3):
        rank_dir = tmp_path / "dump" / f"step{step}" / "rank0"
        assert (rank_dir / "dump.json").is_file()
        assert len(list((rank_dir / "dump_tensor_data").iterdir())) == 3


class SilentServer:
    """A socket that accepts connections and never answers: a hung server, counting the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_a_server_that_never_answers_costs_training_one_check(
    tmp_path: Path, silent: SilentServer, caplog: pytest.LogCaptureFixture
) -> None:
    import torch
    from parity.client import PrecisionDebugger

    PrecisionDebugger.reset()
    dump = tmp_path / "dump"
    debugger = PrecisionDebugger(dump_path=str(dump), level="L1", server=silent.url, run_name="nightly",
                                 project="mlp", tags={"hw": "cpu"})  # fmt: skip
    up = debugger._uploader
    assert debugger_module.SERVER_CHECK_S == 1.0  # the one wait training gives the server
    assert up.offline == "no answer within 1 s" and up._thread is None  # no upload thread, no retries
    for _ in range(3):
        PrecisionDebugger.start()
        torch.exp(torch.ones(2))
        PrecisionDebugger.step()
    PrecisionDebugger.reset()  # what exit does
    assert len(silent.accepted) == 1  # the check, and nothing after it
    warnings = [r.getMessage() for r in caplog.records if r.name == "parity.client.uploader"
                and r.levelname == "WARNING"]  # fmt: skip
    start, at_exit = warnings
    assert f"{silent.url} does not answer (no answer within 1 s): nothing is uploaded" in start
    assert "steps 0-2 (rank 0) not uploaded" in at_exit
    assert at_exit.endswith(f"parity upload {dump.resolve()} --server {silent.url} --name nightly "
                            f"--project mlp --device {detect_device()} --tag hw=cpu")  # fmt: skip
    assert all((dump / f"step{s}" / "rank0" / "dump.json").is_file() for s in range(3))


def test_a_refused_connection_is_offline_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from parity.client import PrecisionDebugger

    PrecisionDebugger.reset()
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", server=url)
    assert "Connection refused" in debugger._uploader.offline
    PrecisionDebugger.reset()
