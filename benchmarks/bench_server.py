"""Server benchmark: upload throughput over loopback, and rows-endpoint latency under 32 concurrent clients.

1. Upload: a tensor dump of 1 GB (``--quick``: 128 MB) in 64 MB ``.pt`` files is sent with ``parity upload``'s
   code path (sha256 on the client, streamed PUTs, ``--jobs`` in parallel) to a fresh ``parity server``.
   Target: >= 200 MB/s.
2. Rows: two statistics-mode dumps of ~33,334 APIs (3 tensor leaves each: ~100,000 rows) are uploaded and
   compared on the server; then 32 client threads page through ``GET /comparisons/{id}/rows`` (random
   offsets, some with ``failing=true``, ``status=fail,warning`` or a ``name`` filter) and the per-request
   latency is measured.
   Target: p99 <= 100 ms.

Run: ``.venv/bin/python benchmarks/bench_server.py [--quick] [--keep DIR]``. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from parity.client.rest import ParityClient
from parity.client.upload import upload_dump

from parity.demo import ServerProcess


def write_tensor_dump(root: Path, total_mb: int, file_mb: int = 64) -> int:
    """A tensor dump of ``total_mb`` MB in ``file_mb`` MB float32 ``.pt`` files; returns its size in bytes."""
    import torch

    rank_dir = root / "step0" / "rank0"
    tensor_dir = rank_dir / "dump_tensor_data"
    tensor_dir.mkdir(parents=True, exist_ok=True)
    data: dict[str, object] = {}
    gen = torch.Generator().manual_seed(0)
    n = file_mb * (1 << 20) // 4
    for i in range(max(1, total_mb // file_mb)):
        name = f"Torch.matmul.{i}.forward"
        t = torch.randn(n, generator=gen)
        torch.save(t, tensor_dir / f"{name}.output.0.pt")
        data[name] = {
            "input_args": [],
            "input_kwargs": {},
            "output": [_leaf(t.numel(), f"{name}.output.0.pt")],
        }
    (rank_dir / "dump.json").write_text(
        json.dumps(
            {
                "task": "tensor",
                "level": "L1",
                "framework": "pytorch",
                "dump_data_dir": str(tensor_dir),
                "data": data,
            }
        )
    )
    return sum(p.stat().st_size for p in rank_dir.rglob("*") if p.is_file())


def _leaf(
    numel: int, data_name: str | None = None, stats: tuple[float, float, float, float] = (1, -1, 0, 1)
) -> dict:
    leaf = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [numel],
        "Max": stats[0],
        "Min": stats[1],
        "Mean": stats[2],
        "Norm": stats[3],
        "requires_grad": False,
    }
    if data_name:
        leaf["data_name"] = data_name
    return leaf


def write_stats_dump(root: Path, apis: int, *, perturb: float, seed: int = 0) -> None:
    """A statistics dump of ``apis`` forward APIs with 2 inputs and 1 output each (3 rows per API)."""
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(1).standard_normal((apis, 3, 4))
    noise = 1 + perturb * rng.standard_normal((apis, 3, 4)) * (rng.random((apis, 1, 1)) < 0.05)
    values = base * noise
    kinds = ("linear", "gelu", "add", "matmul", "layer_norm", "softmax")
    data = {}
    for i in range(apis):
        v = values[i]
        leaves = [_leaf(64, stats=(abs(r[0]) + 1, -abs(r[1]) - 1, r[2], abs(r[3]) + 1)) for r in v.tolist()]
        data[f"Functional.{kinds[i % len(kinds)]}.{i // len(kinds)}.forward"] = {
            "input_args": leaves[:2],
            "input_kwargs": {},
            "output": leaves[2:],
        }
    rank_dir = root / "step0" / "rank0"
    rank_dir.mkdir(parents=True, exist_ok=True)
    (rank_dir / "dump.json").write_text(
        json.dumps(
            {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
        )
    )


def bench_upload(api: ParityClient, work: Path, total_mb: int, jobs: int) -> float:
    root = work / "tensor-dump"
    size = write_tensor_dump(root, total_mb)
    start = time.perf_counter()
    run = upload_dump(api, root, name=f"bench-upload-{time.time_ns()}", jobs=jobs)
    took = time.perf_counter() - start
    rate = size / took / 1e6
    print(
        f"upload: {size / 1e6:.0f} MB in {len(list(root.rglob('*.pt')))} tensor files, --jobs {jobs}: "
        f"{took:.2f} s = {rate:.0f} MB/s (target >= 200 MB/s), run {run.id} {run.status}"
    )
    return rate


def hammer(
    server: str, comparison_id: str, total: int, clients: int, requests: int
) -> tuple[list[float], float, list[str]]:
    """``clients`` threads sending ``requests`` rows requests each, back to back; sorted latencies (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []
    barrier = threading.Barrier(clients)

    def client(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[float] = []
        with httpx.Client(base_url=server, timeout=30) as http:
            barrier.wait()
            for _ in range(requests):
                params: dict[str, str | int] = {"limit": 100, "offset": rng.randrange(0, max(1, total - 100))}
                kind = rng.random()
                if kind < 0.1:
                    params = {"failing": "true", "limit": 100, "offset": 0}
                elif kind < 0.2:
                    params = {"status": "fail,warning", "limit": 100, "offset": rng.randrange(0, 1000)}
                elif kind < 0.3:
                    params = {"name": rng.choice(["gelu", "linear.1", "softmax"]), "limit": 100}
                start = time.perf_counter()
                r = http.get(f"/api/v1/comparisons/{comparison_id}/rows", params=params)
                mine.append(time.perf_counter() - start)
                # Parsing every body would make this process, not the server, the bottleneck on 2 cores.
                if r.status_code != 200 or (len(mine) % 10 == 1 and not r.json()["data"]):
                    errors.append(f"{r.status_code} {params} {r.text[:200]}")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return latencies, wall, errors


def bench_rows(api: ParityClient, server: str, work: Path, apis: int, clients: int, requests: int) -> float:
    for name, perturb in (("bench", 0.0), ("target", 0.5)):
        write_stats_dump(work / f"stats-{name}", apis, perturb=perturb)
    t0 = time.perf_counter()
    ids = {}
    for name in ("bench", "target"):
        ids[name] = upload_dump(api, work / f"stats-{name}", name=f"bench-stats-{name}-{time.time_ns()}").id
    t1 = time.perf_counter()
    info = api.create_comparison(ids["target"], ids["bench"])
    info = api.wait_for_comparison(info.id, timeout=1800, poll_interval=0.5)
    t2 = time.perf_counter()
    if info.status != "succeeded" or info.summary is None:
        raise SystemExit(f"comparison failed: {info.error}")
    summary = info.summary
    total = summary.rows
    print(
        f"rows setup: {apis} APIs per run uploaded in {t1 - t0:.1f} s, "
        f"compared on the server in {t2 - t1:.1f} s: {total} rows, {summary.failing_rows} failing"
    )

    p99 = 0.0
    # One client first: the server's own time per request, which 32 clients can only queue behind.
    for n_clients, n_requests in ((1, 100), (clients, requests)):
        latencies, wall, errors = hammer(server, info.id, total, n_clients, n_requests)
        p50 = statistics.median(latencies) * 1e3
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3
        target = " (target p99 <= 100 ms)" if n_clients == clients else ""
        print(
            f"rows: {len(latencies)} GET /comparisons/{{id}}/rows (limit 100), {n_clients} clients, "
            f"{total} rows: p50 {p50:.1f} ms, p99 {p99:.1f} ms{target}, "
            f"{len(latencies) / wall:.0f} req/s, {len(errors)} errors"
        )
        if errors:
            print("first error:", errors[0])
    return p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="128 MB upload, 10k-row comparison, fewer requests"
    )
    parser.add_argument("--jobs", type=int, default=4, help="parallel uploads (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="server compare workers (default 2)")
    parser.add_argument("--keep", type=Path, default=None, help="work dir to keep (default: a temp dir)")
    parser.add_argument("--skip-upload", action="store_true")
    parser.add_argument("--skip-rows", action="store_true")
    args = parser.parse_args()
    total_mb, apis, requests = (128, 3334, 20) if args.quick else (1024, 33334, 60)
    work = args.keep or Path(tempfile.mkdtemp(prefix="parity-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    srv = ServerProcess(work / "server-data", env={"PARITY_WORKERS": str(args.workers)})
    with srv:
        print(f"server {srv.url}, data {srv.data_dir}", file=sys.stderr)
        with ParityClient(srv.url, timeout=600) as api:
            if not args.skip_upload:
                bench_upload(api, work, total_mb, args.jobs)
            if not args.skip_rows:
                bench_rows(api, srv.url, work, apis, clients=32, requests=requests)
    if args.keep is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
