"""Local pool benchmark (not a test): one multi-rank statistics comparison on 1, then 2 local workers.

    .venv/bin/python benchmarks/bench_pool.py [--ranks 16] [--apis 4000] [--repeat 3] [--cache-dir DIR]

Each measurement starts a real ``parity server`` (SQLite, file store, ``PARITY_WORKERS`` 1 or 2) on the same
data, the runs uploaded once over REST; the wall time is the server's (the comparison's creation to its last
rank's end). 1 and 2 workers alternate ``--repeat`` times so that a change of the machine's load falls on
both; the last line is the median of the paired speed-ups, with the load average, since on a machine shared
with other jobs a second worker does not get a core of its own. Beside it, what the machine gives a second
CPU-bound process at the same time (two plain Python loops against one, measured before and after): the
ceiling of any pool's speed-up there and then. Target (issue 21): >= 1.7x, as Celery. The measuring code is
``bench_scale.py``'s (its ``statistics`` figure, local pool only).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import bench_pairs, cached, statistics_pair  # noqa: E402


def _spin(n: int) -> None:
    total = 0
    for i in range(n):
        total += i * i


def machine_reference(n: int = 10_000_000, repeat: int = 3) -> float:
    """How much faster two CPU-bound processes do twice the work of one, now (2.0: two free cores)."""
    ctx = multiprocessing.get_context("spawn")
    ratios = []
    for _ in range(repeat):
        walls = []
        for count in (1, 2):
            procs = [ctx.Process(target=_spin, args=(n,)) for _ in range(count)]
            started = time.perf_counter()
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            walls.append(time.perf_counter() - started)
        ratios.append(2 * walls[0] / walls[1])
    return statistics.median(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--apis", type=int, default=4000, help="APIs a rank")
    parser.add_argument("--repeat", type=int, default=3, help="1 and 2 workers this many times in turn")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "parity-bench-scale")
    args = parser.parse_args()
    key = f"statistics-{args.ranks}r-{args.apis}"
    npu, gpu = cached(args.cache_dir, key, lambda f: statistics_pair(f, args.ranks, args.apis))
    load_before, reference = os.getloadavg()[0], [machine_reference()]
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        rows = bench_pairs(f"statistics {args.ranks} ranks", Path(tmp), npu, gpu, ["local"], None,
                           repeat=args.repeat)  # fmt: skip
    reference.append(machine_reference())
    speed_up = rows[-1][1]
    print(f"local pool 1 -> 2 workers, one {args.ranks}-rank statistics comparison: {speed_up}  "
          f"(load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores; "
          f"two CPU-bound processes got {reference[0]:.2f}x before, {reference[1]:.2f}x after)",
          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
