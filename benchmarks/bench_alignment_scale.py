"""The alignment at scale against issue 37's adversarial probe (not a test): ``N`` calls a side, every call a
gap of its own in module scopes that alternate call by call, every tensor with the same statistics
(``tests/alignment_probes.py``). Prints the wall and CPU time of ``align_rows`` and the growth of the
process's peak RSS while it runs (the dumps are loaded before; target: under 10 s and 300 MB at 200,000).

    .venv/bin/python benchmarks/bench_alignment_scale.py [--calls 200000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    from parity.shared.compare.alignment import align_rows
    from parity.shared.compare.rows import side_rows
    from parity.shared.dump.reader import load_construct, load_dump

    from tests.alignment_probes import write_alternating_scopes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls a side")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target, bench = write_alternating_scopes(args.dir or Path(tmp), args.calls)
        npu = side_rows(load_dump(target), tensor_mode=False)
        ref = side_rows(load_dump(bench), tensor_mode=False)
        modules = (load_construct(target.parent / "construct.json"),
                   load_construct(bench.parent / "construct.json"))  # fmt: skip
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS from here on
        before = _rss_mb("VmRSS")
        wall, cpu = time.perf_counter(), time.process_time()
        pairing, aligned = align_rows(npu, ref, modules=modules)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        peak = _rss_mb("VmHWM")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"alignment, {args.calls:,} calls a side, alternating scopes (load average {load}): "
          f"{len(aligned.gaps):,} gaps, {sum(j >= 0 for j in pairing.bench_index):,} rows paired; "
          f"wall {wall:.2f} s, CPU {cpu:.2f} s (target < 10 s); peak RSS +{peak - before:.0f} MB "
          "(target < 300 MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
