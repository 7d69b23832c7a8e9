"""The plan endpoint under load (issue 37, not a test): a real ``parity server`` holding a statistics run of
a ``--mb`` MB dump.json (validated: its sidecar stored) and a succeeded comparison whose summary names
suspects in it; ``--requests`` concurrent ``GET /comparisons/{id}/plan?neighbours=1`` while ``/healthz`` is
asked every 50 ms. Prints the plans' wall time, the slowest ``/healthz`` (target < 0.5 s) and the server
process's RSS growth (sampled every 50 ms).

    .venv/bin/python benchmarks/bench_plan_load.py [--mb 86] [--requests 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    import httpx
    from parity.server.db import Database
    from parity.server.models import Comparison
    from parity.server.settings import Settings

    from benchmarks.bench_scale import big_dump
    from tests.server.conftest import ServerProcess, upload_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=86)
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = big_dump(Path(tmp) / "dump" / "step0" / "rank0", args.mb).parent.parent
        data_dir = Path(tmp) / "data"
        srv = ServerProcess(data_dir, {"PARITY_WORKERS": "1"}).start()
        try:
            api = srv.client()
            target = upload_run(api, root, name="plan-target", device="npu")
            bench = upload_run(api, root, name="plan-bench", device="gpu")
            deadline = time.monotonic() + 600
            run_url = f"/runs/{target['id']}"
            while time.monotonic() < deadline and api.get(run_url).json()["status"] != "complete":
                time.sleep(0.2)
            cid = uuid.uuid4().hex
            summary = {"format_version": 1, "kind": "single-rank", "rank": 0, "mode": "statistics",
                       "npu_path": "step0/rank0/dump.json", "first_divergence": None,
                       "suspects": [{"api": f"Torch.op{i}.0.forward", "score": 1.0 / (i + 1)}
                                    for i in range(0, 4000, 400)]}  # fmt: skip
            db = Database.connect(Settings(data_dir=data_dir).resolved_database_url)
            with db.write() as session:
                session.add(Comparison(id=cid, target_run_id=target["id"], bench_run_id=bench["id"], step=0,
                                       status="succeeded", summary=summary))  # fmt: skip
            db.dispose()
            pid = srv.proc.pid if srv.proc is not None else os.getpid()
            before, peak, slowest = _rss_mb(pid), 0.0, 0.0
            stop = threading.Event()

            def watch() -> None:
                nonlocal peak, slowest
                with httpx.Client(base_url=srv.url, timeout=60) as client:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        assert client.get("/healthz").status_code == 200
                        slowest = max(slowest, time.perf_counter() - t0)
                        peak = max(peak, _rss_mb(pid))
                        stop.wait(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.requests) as pool:
                plan = f"/comparisons/{cid}/plan"
                answers = list(pool.map(lambda _: api.get(plan, params={"neighbours": 1}),
                                        range(args.requests)))  # fmt: skip
            wall = time.perf_counter() - t0
            stop.set()
            watcher.join()
            assert all(a.status_code == 200 for a in answers), answers[0].text
            calls = len(answers[0].json()["calls"])
        finally:
            srv.stop()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"plans of a {args.mb} MB dump.json, {args.requests} at once (load average {load}): {calls} calls "
          f"each, all answered in {wall:.2f} s; slowest /healthz {slowest * 1000:.0f} ms (target < 500 ms); "
          f"API process RSS {before:.0f} -> peak {peak:.0f} MB (+{peak - before:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
