"""A training job whose Parity server is down: training finishes, one warning, the dump stays on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
uploader = BackgroundUploader(url, run_name="down", retry_budget_s=1.0, initial_backoff_s=0.05)
x = np.ones((2, 2), dtype=np.float32)
for step in range(3):
    rank_dir = root / f"step{step}" / "rank0"
    DumpBuilder("tensor").api("Torch.mul.0.forward", [x * step, x], [x * step]).write(rank_dir)
    uploader.submit_rank_dir(step, 0, rank_dir)
print("training finished")
# no close(): the uploader's atexit hook drains and gives up on its own
"""


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
    warnings = [
        line for line in done.stderr.splitlines() if line.startswith("WARNING parity.client.uploader")
    ]
    assert len(warnings) == 1, done.stderr
    assert "could not create the run" in warnings[0] and "server unreachable" in warnings[0]
    assert "Traceback" not in done.stderr
    for step in range(3):
        rank_dir = tmp_path / "dump" / f"step{step}" / "rank0"
        assert (rank_dir / "dump.json").is_file()
        assert len(list((rank_dir / "dump_tensor_data").iterdir())) == 3
