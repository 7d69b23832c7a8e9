"""What the crafted replay dumps of issue 37 cost (not a test): each probe of ``tests/replay_probes.py``
replayed by ``parity replay`` in a process of its own, its wall time, peak RSS (of that process and its
children, ``/usr/bin/time``'s maximum) and exit status, and the verdict it printed.

    .venv/bin/python benchmarks/bench_replay_budget.py [--only max_pool1d,einsum] [--limit 120] [--dir DIR]

``--limit``: seconds after which a replay is killed (a probe held past it shows ``killed``): the probes
were written to hold a worker for minutes before the replay had a budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _peak_rss(stderr: str) -> str:
    for line in stderr.splitlines()[::-1]:
        if line.startswith("PEAK_KB="):
            return f"{int(line.split('=', 1)[1]) / 1024:.0f} MB"
    return "?"


def main() -> int:
    from tests.replay_probes import PROBES, write_probe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated probe names (default: all)")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds before a replay is killed")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(PROBES)
    base = args.dir or Path(tempfile.mkdtemp(prefix="replay-budget-"))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    for name in names:
        dump, entry = write_probe(name, base / name / "rank0")
        spec = base / name / "compare.json"
        spec.write_text(json.dumps({"npu_path": str(dump), "bench_path": str(dump)}))
        size = sum(p.stat().st_size for p in dump.parent.rglob("*") if p.is_file())
        command = ["/usr/bin/time", "-f", "PEAK_KB=%M", sys.executable, "-m", "parity", "replay", "-i",
                   str(spec), entry]  # fmt: skip
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.limit)
            status, out, err = str(proc.returncode), proc.stdout.strip(), proc.stderr
        except subprocess.TimeoutExpired as exc:
            status, out, err = f"killed after {args.limit:.0f} s", "", str(exc.stderr or "")
        wall = time.perf_counter() - start
        verdict = out.splitlines()[-1] if out else (err.strip().splitlines() or ["(no output)"])[-1]
        print(f"{name:24s} {size / 1024:6.1f} KB  {wall:7.2f} s  peak {_peak_rss(err):>8s}  exit {status}")
        print(f"    {verdict[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
