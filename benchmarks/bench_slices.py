"""What slicing a rank costs (not a test): one rank compared whole, and as K slices of its calls + the join.

    .venv/bin/python benchmarks/bench_slices.py [--slices 4] [--repeat 3] [--apis 8000] [--dir DIR]

A server splits a rank pair past ``PARITY_TASK_MAX_BYTES`` into K tasks (``shared.compare.slices``). Each
slice reads and pairs the whole dump.json but builds only its calls' rows and, in tensor mode, reads only
its tensor files; the slice that finishes last joins the parts (localization, advice, suspects, xlsx).
Printed per mode: the whole rank's time, the slowest slice (the wall time on K free workers, join excluded),
the slices' total (the work on one worker), the join, the slices' total + join over the whole (the cost of
slicing), and the largest share of tensor bytes one slice reads. Medians of ``--repeat`` runs, in this
process, serially (the slices would run on K workers; here they run one after the other so their CPU adds up
honestly).

Data: bench_compare's generators (``--quick`` tensor sizes, 146 pairs, ~64 MB a side; statistics ``--apis``
entries of 3 rows), written once into ``--dir`` (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _generate(base: Path, apis: int) -> None:
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "import bench_compare as b; b.generate_tensor_dumps(Path(sys.argv[2]) / 'tensor', True);"
        "b.generate_statistics_dumps(Path(sys.argv[2]) / 'statistics', int(sys.argv[3]))"
    )
    subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(base), str(apis)], check=True)


def _measure(pair_dir: Path, slices: int, repeat: int) -> tuple[str, ...]:
    from parity.shared.compare.job import (
        RankPair,
        compare_rank,
        compare_slice,
        finish_rank,
        slice_tensor_files,
    )
    from parity.shared.compare.options import CompareOptions
    from parity.shared.compare.slices import CallSlice, decode_part, encode_part

    pair = RankPair(0, pair_dir / "npu" / "dump.json", pair_dir / "bench" / "dump.json")
    options = CompareOptions()
    out = pair_dir / "out"
    out.mkdir(exist_ok=True)
    whole_s, slowest_s, total_s, join_s = [], [], [], []
    rows = 0
    for _ in range(repeat):
        began = time.perf_counter()
        whole = compare_rank(pair, options, xlsx_path=out / "whole.xlsx", advisor_path=out / "whole.txt")
        whole_s.append(time.perf_counter() - began)
        rows = len(whole.result.rows)
        parts, times = [], []
        for k in range(slices):
            began = time.perf_counter()
            part = compare_slice(pair, options, CallSlice(k, slices))
            parts.append(decode_part(encode_part(part)))  # through the stored form, as between tasks
            times.append(time.perf_counter() - began)
        began = time.perf_counter()
        joined = finish_rank(pair, parts, xlsx_path=out / "sliced.xlsx", advisor_path=out / "sliced.txt")
        join_s.append(time.perf_counter() - began)
        assert len(joined.result.rows) == rows
        slowest_s.append(max(times))
        total_s.append(sum(times))
    tensor_dir = pair_dir / "npu" / "dump_tensor_data"
    share = "-"
    if tensor_dir.is_dir():
        all_bytes = sum(p.stat().st_size for p in tensor_dir.iterdir())
        names = [slice_tensor_files(pair, options, CallSlice(k, slices))[0] for k in range(slices)]
        largest = max(sum((tensor_dir / n).stat().st_size for n in part) for part in names)
        share = f"{largest / all_bytes:.0%}"
    m = statistics.median
    ratio = (m(total_s) + m(join_s)) / m(whole_s)
    return (f"{rows} rows", f"whole {m(whole_s):6.2f} s", f"slowest slice {m(slowest_s):6.2f} s",
            f"slices' total {m(total_s):6.2f} s", f"join {m(join_s):5.2f} s",
            f"(total + join) / whole {ratio:4.2f}x", f"largest slice's tensor bytes {share}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--apis", type=int, default=8000, help="statistics entries (3 rows each)")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    from parity.process_policy import collector_paused

    base = args.dir or Path(tempfile.mkdtemp(prefix="parity-bench-slices-"))
    if not (base / "statistics").exists():
        _generate(base, args.apis)
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} (shared: figures are noisy)")
    for mode in ("tensor", "statistics"):
        with collector_paused():  # as the server's task runner and the CLI run a compare
            figures = _measure(base / mode, args.slices, args.repeat)
        print(f"{mode:<10} {args.slices} slices  " + "  ".join(figures))
    print(f"machine after: load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
