"""Scale benchmark (not a test): a comparison spread over the workers as one task per rank.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--tensor-gb 4] [--complete-mb 200]
                                               [--redis-url redis://...] [--only NAME ...]

Prints, each figure measured on a real ``parity server`` (SQLite, file store) fed over REST:

* ``statistics``: a 16-rank statistics pair (4,000 APIs a rank) compared with 1 and then 2 workers, on the
  local pool and, with ``--redis-url`` (or ``PARITY_TEST_REDIS_URL``), on Celery workers: wall time from
  ``POST /comparisons`` to ``succeeded``, the speed-up, each worker's peak RSS, and the peak staging (the
  bytes laid out in task folders at once, per worker; hard links on a file store, so no bytes are copied);
* ``tensor``: an 8-rank tensor pair of ``--tensor-gb`` GB in all, on 1 and 2 local workers;
* ``overhead``: 256 ranks of one API each on one worker: wall time per rank, an upper bound of a task's
  fixed cost (claim, lease, staging, rows, merge check);
* ``complete``: the API process's RSS from ``POST /runs/{id}/complete`` until a worker has validated a
  ``--complete-mb`` MB dump.json, the slowest ``/healthz`` answer meanwhile, and the validating worker's peak
  RSS (and its parsing child's, which exits after).

Targets (issue 11): >= 1.7x from 1 to 2 workers on a 2-core machine, worker peak RSS <= 1 GB, staging <= 2
ranks' files per worker, API RSS growth <= 100 MB during the complete, task overhead < 50 ms a rank. On a
machine shared with other jobs the speed-up is distorted: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.factories import DumpBuilder, stats_leaf, write_raw_dump  # noqa: E402
from tests.server.conftest import ServerProcess, upload_run  # noqa: E402

MB = 1e6


class Sampler:
    """Samples, every 50 ms: the peak RSS of each worker process, the API process's RSS, and the bytes in
    the staging folders (per task folder, summed)."""

    def __init__(self, api_pid: int | None, worker_pids: Callable[[], list[int]], tmp_dir: Path) -> None:
        self.api_pid, self.worker_pids, self.tmp_dir = api_pid, worker_pids, tmp_dir
        self.worker_peak: dict[int, int] = {}
        self.api_peak = 0
        self.staging_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.worker_pids():
                try:
                    rss = psutil.Process(pid).memory_info().rss
                except psutil.Error:
                    continue
                self.worker_peak[pid] = max(self.worker_peak.get(pid, 0), rss)
            if self.api_pid is not None:
                try:
                    self.api_peak = max(self.api_peak, psutil.Process(self.api_pid).memory_info().rss)
                except psutil.Error:
                    pass
            self.staging_peak = max(self.staging_peak, _tree_bytes(self.tmp_dir, "task-*"))
            self._stop.wait(0.05)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _tree_bytes(folder: Path, pattern: str) -> int:
    total = 0
    for task in folder.glob(pattern) if folder.is_dir() else ():
        for root, _, files in os.walk(task):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


# -- data ----------------------------------------------------------------------------------------------------


def statistics_pair(base: Path, ranks: int, apis: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    for side, shift in (("npu", 1e-3), ("gpu", 0.0)):
        for rank in range(ranks):
            stats = rng.standard_normal((apis, 4)) + 5.0
            data = {
                f"Torch.op{i}.0.forward": {
                    "input_args": [stats_leaf(*map(float, stats[i]))],
                    "output": [stats_leaf(*map(float, stats[i] + shift))],
                }
                for i in range(apis)
            }
            write_raw_dump(base / side / "step0" / f"rank{rank}", data)
    return base / "npu", base / "gpu"


def tensor_pair(base: Path, ranks: int, total_bytes: int) -> tuple[Path, Path]:
    """``ranks`` ranks of fp32 tensors of 8 MB each, ``total_bytes`` over both sides."""
    per_rank = total_bytes // 2 // ranks
    n = max(1, per_rank // (8 << 20))
    rng = np.random.default_rng(1)
    for rank in range(ranks):
        tensors = [rng.standard_normal(2 << 20).astype(np.float32) for _ in range(n)]
        for side, noise in (("npu", 1e-4), ("gpu", 0.0)):
            builder = DumpBuilder("tensor")
            for i, t in enumerate(tensors):
                builder.api(f"Torch.op{i}.0.forward", outputs=[t + np.float32(noise)])
            builder.write(base / side / "step0" / f"rank{rank}")
    return base / "npu", base / "gpu"


def big_dump(path: Path, megabytes: int) -> Path:
    """A statistics dump.json of about ``megabytes`` MB (msprobe's indent=1 layout)."""
    from parity.shared.dump.writer import dumps_indent1

    apis = megabytes * 1_000_000 // 490
    leaf = stats_leaf(1.5, -0.5, 0.25, 3.0)
    doc = {
        "task": "statistics",
        "level": "L1",
        "framework": "pytorch",
        "dump_data_dir": None,
        "data": {f"Torch.op{i}.0.forward": {"input_args": [leaf], "output": [leaf]} for i in range(apis)},
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "dump.json").write_text(dumps_indent1(doc))
    return path


# -- runs ----------------------------------------------------------------------------------------------------


class Celery:
    def __init__(self, env: dict[str, str], concurrency: int, log: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "parity.server.jobs.celery_app",
                "worker",
                "--pool=prefork",
                f"--concurrency={concurrency}",
                "-l",
                "warning",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=open(log, "ab"),
            stderr=subprocess.STDOUT,  # noqa: SIM115
        )

    def worker_pids(self) -> list[int]:
        return _children(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def compare_once(
    api: httpx.Client, target: str, bench: str, sampler: Sampler
) -> tuple[float, dict[str, Any]]:
    with sampler:
        start = time.perf_counter()
        cid = api.post("/comparisons", json={"target_run": target, "bench_run": bench}).json()["id"]
        while True:
            body = api.get(f"/comparisons/{cid}").json()
            if body["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
    if body["status"] != "succeeded":
        raise RuntimeError(f"comparison {cid} failed: {body['error']}")
    return wall, body


def run_pair(
    base: Path, npu: Path, gpu: Path, workers: int, backend: str, redis_url: str | None
) -> tuple[float, Sampler, dict[str, Any]]:
    env = {"PARITY_WORKERS": str(workers)}
    if backend == "celery":
        assert redis_url is not None
        env |= {"PARITY_JOB_BACKEND": "celery", "PARITY_CELERY_BROKER_URL": redis_url}
    data = base / f"data-{backend}-{workers}-{time.monotonic_ns()}"
    srv = ServerProcess(data, env).start()
    celery = Celery(srv.env, workers, data / "celery.log") if backend == "celery" else None
    try:
        with srv.client() as api:
            target = upload_run(api, npu)["id"]
            bench = upload_run(api, gpu, device="gpu")["id"]
            assert srv.proc is not None
            pids = celery.worker_pids if celery else (lambda: _children(srv.proc.pid))  # type: ignore[union-attr]
            sampler = Sampler(None, pids, data / "blobs" / ".tmp")
            wall, body = compare_once(api, target, bench, sampler)
    finally:
        if celery is not None:
            celery.stop()
        srv.stop()
        shutil.rmtree(data, ignore_errors=True)
    return wall, sampler, body


def _rank_bytes(step: Path) -> int:
    sizes = [sum(f.stat().st_size for f in r.rglob("*") if f.is_file()) for r in step.glob("rank*")]
    return max(sizes) if sizes else 0


def bench_pairs(
    label: str, base: Path, npu: Path, gpu: Path, backends: list[str], redis_url: str | None
) -> list[tuple[str, str]]:
    rows = _Printed()
    rank_pair = _rank_bytes(npu / "step0") + _rank_bytes(gpu / "step0")
    for backend in backends:
        walls = {}
        for workers in (1, 2):
            wall, sampler, body = run_pair(base, npu, gpu, workers, backend, redis_url)
            walls[workers] = wall
            peak = max(sampler.worker_peak.values(), default=0)
            staged = sampler.staging_peak
            rows.append(
                (
                    f"{label} {backend} {workers} worker(s)",
                    f"{wall:7.2f} s  {body['summary']['rows']} rows  "
                    f"worker peak RSS {peak / 2**20:5.0f} MiB  peak staging {staged / MB:6.1f} MB = "
                    f"{staged / rank_pair:.2f} rank pairs ({staged / rank_pair / workers:.2f} per worker)",
                )
            )
        rows.append(
            (f"{label} {backend} speed-up 1 -> 2 workers", f"{walls[1] / walls[2]:.2f}x (target >= 1.7x)")
        )
    return rows


def bench_overhead(base: Path, ranks: int) -> list[tuple[str, str]]:
    npu, gpu = statistics_pair(base / "tiny", ranks, 1)
    wall, _, body = run_pair(base, npu, gpu, 1, "local", None)
    assert body["summary"]["ranks"] == list(range(ranks))
    return [
        (
            f"task overhead ({ranks} one-API ranks, 1 worker)",
            f"{wall:7.2f} s  = {wall / ranks * 1000:5.1f} ms a rank (target < 50 ms)",
        )
    ]


def bench_complete(base: Path, megabytes: int) -> list[tuple[str, str]]:
    dump = big_dump(base / "big" / "step0" / "rank0", megabytes)
    size = (dump / "dump.json").stat().st_size
    data = base / "data-complete"
    srv = ServerProcess(data, {"PARITY_WORKERS": "1"}).start()
    try:
        with srv.client() as api:
            run = api.post("/runs", json={"name": "big", "device": "npu"}).json()
            body = (dump / "dump.json").read_bytes()
            import hashlib

            digest = hashlib.sha256(body).hexdigest()
            resp = api.put(
                f"/runs/{run['id']}/files/step0/rank0/dump.json",
                content=body,
                headers={"X-Content-SHA256": digest},
            )
            del body
            assert resp.status_code == 201, resp.text
            assert srv.proc is not None
            before = psutil.Process(srv.proc.pid).memory_info().rss
            # The local pool's worker validates (issue 11): it and its parsing child are sampled.
            sampler = Sampler(srv.proc.pid, lambda: _children(srv.proc.pid), data / "blobs" / ".tmp")
            slowest = 0.0
            done = threading.Event()

            def health() -> None:
                nonlocal slowest
                while not done.is_set():
                    t = time.perf_counter()
                    httpx.get(f"{srv.url}/healthz", timeout=60)
                    slowest = max(slowest, time.perf_counter() - t)
                    time.sleep(0.05)

            with sampler:
                checker = threading.Thread(target=health)
                checker.start()
                start = time.perf_counter()
                resp = api.post(f"/runs/{run['id']}/complete", timeout=600)
                answered = time.perf_counter() - start
                while (state := api.get(f"/runs/{run['id']}").json())["status"] == "validating":
                    time.sleep(0.05)
                wall = time.perf_counter() - start
                done.set()
                checker.join()
                workers = [p for p in psutil.Process(srv.proc.pid).children()
                           if "spawn_main" in " ".join(p.cmdline())]  # fmt: skip
            assert resp.status_code == 202 and state["status"] == "complete", (resp.text, state)
    finally:
        srv.stop()
        shutil.rmtree(data, ignore_errors=True)
    growth = sampler.api_peak - before
    worker_pids = {p.pid for p in workers}
    worker_peak = max((rss for pid, rss in sampler.worker_peak.items() if pid in worker_pids), default=0)
    child_peak = max((rss for pid, rss in sampler.worker_peak.items() if pid not in worker_pids), default=0)
    return [
        (
            f"complete of a {size / MB:.0f} MB dump.json",
            f"{wall:7.2f} s (202 in {answered * 1000:.0f} ms)  API process RSS +{growth / 2**20:6.0f} MiB "
            f"(target <= 100 MB)  slowest /healthz {slowest * 1000:6.0f} ms",
        ),
        (
            "  validation on the worker",
            f"worker peak RSS {worker_peak / 2**20:5.0f} MiB, its parsing child (exits after) "
            f"{child_peak / 2**20:5.0f} MiB",
        ),
    ]


class _Printed(list[tuple[str, str]]):
    """Figures, each printed as it is measured (a long run cut short keeps what it measured)."""

    def append(self, row: tuple[str, str]) -> None:
        print(f"{row[0]:<52}  {row[1]}", flush=True)
        super().append(row)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the data")
    parser.add_argument("--tensor-gb", type=float, default=4.0, help="tensor pair size, both sides (GB)")
    parser.add_argument("--complete-mb", type=int, default=200, help="dump.json size for the complete figure")
    parser.add_argument("--redis-url", default=os.environ.get("PARITY_TEST_REDIS_URL"))
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["statistics", "tensor", "overhead", "complete"],
        default=["statistics", "tensor", "overhead", "complete"],
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="parity-bench-scale-"))
    backends = ["local"] + (["celery"] if args.redis_url else [])
    rows = _Printed()
    rows.append(
        (
            "machine",
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
            f"(shared: other jobs distort the speed-ups)",
        )
    )
    try:
        if "statistics" in args.only:
            apis = 400 if args.quick else 4000
            npu, gpu = statistics_pair(base / "stats", 16, apis)
            bench_pairs(f"statistics 16 ranks x {apis} APIs", base, npu, gpu, backends, args.redis_url)
            if not args.redis_url:
                rows.append(("statistics celery", "skipped: no --redis-url / PARITY_TEST_REDIS_URL"))
            shutil.rmtree(base / "stats", ignore_errors=True)
        if "tensor" in args.only:
            total = int(args.tensor_gb * (0.1 if args.quick else 1.0) * 1e9)
            npu, gpu = tensor_pair(base / "tensor", 8, total)
            bench_pairs(f"tensor 8 ranks, {total / 1e9:.1f} GB", base, npu, gpu, ["local"], None)
            shutil.rmtree(base / "tensor", ignore_errors=True)
        if "overhead" in args.only:
            for row in bench_overhead(base, 256):
                rows.append(row)
        if "complete" in args.only:
            for row in bench_complete(base, args.complete_mb // (10 if args.quick else 1)):
                rows.append(row)
        rows.append(("machine after", f"load average {os.getloadavg()[0]:.1f}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
