"""Compare benchmark (not a test): tensor-mode MB/s and statistics-mode rows/s, with peak RSS.

    .venv/bin/python benchmarks/bench_compare.py [--quick] [--repeat 3] [--workers N] [--dir DIR]

Tensor mode: >= 1.5 GB of fp32 tensors in >= 100 API pairs of mixed sizes (1 KB to 100 MB) written as two
msprobe-layout dumps (dump.json + dump_tensor_data/*.pt, as tests/factories.py writes them), compared
through ``parity.shared.metrics.parallel.compare_tensor_files`` (on the thread pool ``parity compare`` builds,
on a process pool, on none) and through the whole engine ``parity.shared.compare.engine.compare_dumps``.
MB/s counts **both sides' bytes** over the wall time, as msprobe's docs do (msprobe measured ~78 MB/s here).

Through the CLI, the whole pair and a pair of about 1 KB (the fixed cost: start-up and imports) are timed
side by side with msprobe 8.3.3's own ``msprobe -f pytorch compare`` on the same files, when its venv exists
(``make msprobe-venv``: ``.venv-msprobe``, or ``PARITY_MSPROBE_VENV``); without it, against the ~78 MB/s
above. The fixed cost of md5 mode is timed on a 1 KB md5 pair.

Statistics mode: 20,000 APIs (~60,000 rows a side) through ``compare_dumps`` (rows/s = NPU rows / time),
compact and again with the ``indent=1`` layout msprobe writes, and the whole CLI run to xlsx
(``parity compare -i compare.json -o out``), against msprobe's ~500 rows/s.

Beside each engine figure, a fixed pure-Python loop's time says how fast this (noisy) machine ran then.

Each mode runs in a process of its own (a fresh one per compare is what the CLI and the job workers use).
Peak RSS is sampled every 20 ms over this process and all its children (sum of RSS, so pages shared between
processes count more than once: an upper bound). Data is generated in a child process, so this process never
imports torch and its own RSS is what a compare costs. Figures are medians of ``--repeat`` runs; the files sit
in the page cache (just written), as in msprobe's measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6
#: msprobe 8.3.3 in a venv of its own (scripts/msprobe_venv.sh), as tests/interop finds it
MSPROBE_VENV = Path(os.environ.get("PARITY_MSPROBE_VENV") or ROOT / ".venv-msprobe")

# Per-side tensor sizes in bytes (fp32): 104 pairs, 802 MB a side, 1.6 GB both sides.
FULL_SIZES = [100 << 20] * 3 + [50 << 20] * 3 + [25 << 20] * 6 + [10 << 20] * 10 + [4 << 20] * 20 + [
    1 << 20] * 20 + [100 << 10] * 20 + [1 << 10] * 22  # fmt: skip
QUICK_SIZES = [10 << 20] * 2 + [4 << 20] * 6 + [1 << 20] * 20 + [100 << 10] * 40 + [1 << 10] * 40


class PeakRss:
    """Samples the summed RSS of this process and its children in a background thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self.peak = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, int, Any]:
    """Median wall time of ``repeat`` runs of ``fn``, the peak RSS of one more run, and the last result.

    The RSS sampler walks /proc for child processes every few milliseconds, which took ~14% off the
    statistics-mode figure when it ran during the timed runs: so it samples a separate run only.
    """
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    with PeakRss() as rss:
        result = fn()
    return statistics.median(times), rss.peak, result


# --- data generation (runs in a child process: torch stays out of the measuring process) -------------------


def generate_tensor_dumps(out: Path, quick: bool) -> None:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from tests.factories import tensor_leaf

    sizes = QUICK_SIZES if quick else FULL_SIZES
    rng = np.random.default_rng(0)
    docs: dict[str, dict[str, Any]] = {}
    for side in ("npu", "bench"):
        (out / side / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
        docs[side] = {"task": "tensor", "level": "L1", "framework": "pytorch",
                      "dump_data_dir": str(out / side / "dump_tensor_data"), "data": {}}  # fmt: skip
    for i, nbytes in enumerate(sizes):
        name = f"Functional.op{i}.0.forward"
        data_name = f"{name}.output.0.pt"
        n = rng.standard_normal(nbytes // 4, dtype=np.float32)
        b = n * (1 + rng.standard_normal(n.size, dtype=np.float32) * np.float32(1e-4))
        for side, arr in (("npu", n), ("bench", b)):
            t = torch.from_numpy(arr)
            torch.save(t, out / side / "dump_tensor_data" / data_name)
            docs[side]["data"][name] = {"input_args": [], "input_kwargs": {},
                                        "output": [tensor_leaf(t, data_name=data_name)]}  # fmt: skip
    for side, doc in docs.items():
        (out / side / "dump.json").write_text(json.dumps(doc))


def generate_statistics_dumps(out: Path, apis: int, *, indent1: bool = False) -> None:
    """Statistics dumps of ``apis`` entries, 2 inputs + 1 output each, bench within ~0.1% (json only);
    ``indent1`` writes them as msprobe does (``json.dump(indent=1)``), compact otherwise."""
    import random

    from parity.shared.dump.writer import dumps_indent1

    rnd = random.Random(0)

    def leaf(scale: float) -> dict[str, Any]:
        mx, mn = rnd.uniform(1, 3), rnd.uniform(-3, -1)
        mean, norm = rnd.uniform(-0.1, 0.1), rnd.uniform(10, 90)
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [32, 64], "Max": mx * scale,
                "Min": mn * scale, "Mean": mean * scale, "Norm": norm * scale,
                "requires_grad": False}  # fmt: skip

    for side in ("npu", "bench"):
        rnd.seed(0)
        noise = random.Random(1)  # its own stream, so both sides draw the same statistics from ``rnd``
        data = {}
        for i in range(apis):
            scale = 1.0 if side == "npu" else 1.0 + noise.uniform(-1e-3, 1e-3)
            data[f"Torch.op{i % 97}.{i // 97}.forward"] = {
                "input_args": [leaf(scale), leaf(scale)], "input_kwargs": {},
                "output": [leaf(scale)]}  # fmt: skip
        (out / side).mkdir(parents=True, exist_ok=True)
        doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
               "data": data}  # fmt: skip
        (out / side / "dump.json").write_text(dumps_indent1(doc) if indent1 else json.dumps(doc))


def generate_tiny_dumps(out: Path) -> None:
    """A tensor-mode pair and an md5-mode pair of about 1 KB a side (``out/tensor``, ``out/md5``): what a
    compare costs when there is nothing to compare."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from tests.factories import DumpBuilder

    x = np.arange(64, dtype=np.float32)
    for side, shift in (("npu", 0.0), ("bench", 1e-3)):
        y = x + np.float32(shift)
        DumpBuilder("tensor").api("Torch.add.0.forward", inputs=[x], outputs=[y]).write(out / "tensor" / side)
        DumpBuilder("statistics", md5=True).api("Torch.add.0.forward", inputs=[x], outputs=[y]).write(
            out / "md5" / side
        )


# --- measurements ------------------------------------------------------------------------------------------


def bench_tensor(base: Path, quick: bool, repeat: int, workers: int | None) -> list[tuple[str, str]]:
    out = base / "tensor"
    marker = out / f"generated-{'quick' if quick else 'full'}"
    if not marker.is_file():  # a --dir kept from an earlier run is reused: 1.6 GB take a minute to write
        shutil.rmtree(out, ignore_errors=True)
        quick_flag = ["--quick"] if quick else []
        subprocess.run([sys.executable, __file__, "--generate-tensor", str(out), *quick_flag], check=True)
        marker.touch()
    os.sync()  # 1.6 GB just written: its writeback must not run during the measurement
    from parity.shared.metrics.parallel import TensorPairJob, compare_tensor_files

    from parity.process_policy import metric_executor

    doc = json.loads((out / "npu" / "dump.json").read_text())
    names = [entry["output"][0]["data_name"] for entry in doc["data"].values()]
    jobs = [TensorPairJob(i, out / "npu" / "dump_tensor_data" / n, out / "bench" / "dump_tensor_data" / n)
            for i, n in enumerate(names)]  # fmt: skip
    total = sum(os.path.getsize(p) for j in jobs for p in (j.npu_file, j.bench_file) if p is not None)
    largest = max(os.path.getsize(j.npu_file) for j in jobs if j.npu_file is not None)
    rows = [("tensor data", f"{len(jobs)} pairs, {total / MB:.0f} MB both sides "
             f"(fp32, 1 KB..{largest / MB:.0f} MB a tensor)")]  # fmt: skip

    def run(n_workers: int | None, processes: bool = False) -> Callable[[], int]:
        def go() -> int:
            with metric_executor(n_workers, processes=processes) as executor:  # as the CLI builds it
                return sum(1 for _ in compare_tensor_files(jobs, executor=executor))

        return go

    run(workers)()  # warm: numba's on-disk cache, page cache
    for label, n_workers, processes in (("threads (CLI)", workers, False), ("process pool", workers, True),
                                        ("no pool", 1, False)):  # fmt: skip
        t, peak, n = timed(run(n_workers, processes), repeat)
        assert n == len(jobs)
        rows.append((f"compare_tensor_files {label}", f"{total / MB / t:7.0f} MB/s  {t:6.2f} s  "
                     f"peak RSS {peak / 2**20:5.0f} MiB  ({total / MB / t / 78:.1f}x msprobe)"))  # fmt: skip
    rows.append(engine_row("compare_dumps (engine)", out, repeat, lambda t: f"{total / MB / t:7.0f} MB/s",
                           workers))  # fmt: skip
    rows += cli_rows(f"this pair ({total / MB:.0f} MB)", out, repeat, mb=total / MB)
    tiny = base / "tiny"
    shutil.rmtree(tiny, ignore_errors=True)  # a kept --dir: the last run's reports must not count in its size
    subprocess.run([sys.executable, __file__, "--generate-tiny", str(tiny)], check=True)
    size = sum(f.stat().st_size for f in (tiny / "tensor").rglob("*") if f.is_file())
    rows += cli_rows(f"a {size / 1000:.0f} KB tensor pair", tiny / "tensor", repeat, fixed=True)
    size = sum(f.stat().st_size for f in (tiny / "md5").rglob("*") if f.is_file())
    rows += cli_rows(f"a {size / 1000:.0f} KB md5 pair", tiny / "md5", repeat, fixed=True, msprobe=False)
    return rows


def cli_rows(label: str, out: Path, repeat: int, *, mb: float | None = None, fixed: bool = False,
             msprobe: bool = True) -> list[tuple[str, str]]:  # fmt: skip
    """``parity compare`` on ``out``'s pair, and msprobe's compare beside it when its venv is there."""
    ours = cli_seconds(out, repeat)
    theirs = msprobe_seconds(out, max(1, repeat - 1)) if msprobe else None
    rate = f"{mb / ours:7.0f} MB/s  " if mb else ""
    note = "(fixed cost)" if fixed else f"({mb / ours / 78:.1f}x msprobe's 78 MB/s)" if mb else ""
    if theirs is not None:
        note = f"({theirs / ours:.1f}x msprobe{', fixed cost' if fixed else ''})"
    rows = [(f"parity compare CLI, {label}", f"{rate}{ours:6.2f} s  {note}")]
    if theirs is not None:
        rate = f"{mb / theirs:7.0f} MB/s  " if mb else ""
        rows.append((f"msprobe 8.3.3 compare, {label}", f"{rate}{theirs:6.2f} s  (same files, same machine)"))
    return rows


def _write_spec(out: Path) -> Path:
    spec = out / "compare.json"
    spec.write_text(json.dumps({"npu_path": str(out / "npu" / "dump.json"),
                                "bench_path": str(out / "bench" / "dump.json")}))  # fmt: skip
    return spec


def cli_seconds(out: Path, repeat: int) -> float:
    """Median wall time of ``parity compare`` (a fresh process, as a user runs it) on ``out``'s two dumps."""
    spec = _write_spec(out)
    command = [sys.executable, "-m", "parity", "compare", "-i", str(spec), "-o", str(out / "cli-out"),
               "--no-progress"]  # fmt: skip
    return _command_seconds(command, out / "cli-out", repeat)


def msprobe_seconds(out: Path, repeat: int) -> float | None:
    """Median wall time of msprobe 8.3.3's own compare on the same pair; None without its venv."""
    msprobe = MSPROBE_VENV / "bin" / "msprobe"
    if not msprobe.is_file():
        return None
    spec = _write_spec(out)
    command = [str(msprobe), "-f", "pytorch", "compare", "-i", str(spec), "-o", str(out / "msprobe-out")]
    return _command_seconds(command, out / "msprobe-out", repeat)


def _command_seconds(command: list[str], output: Path, repeat: int) -> float:
    # Byte-code caches allowed, as an installed package has them (pip compiles on install): a shell with
    # PYTHONDONTWRITEBYTECODE=1 would otherwise compile ~70 of Parity's modules on every run (~0.1 s).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def run() -> None:
        shutil.rmtree(output, ignore_errors=True)
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{command[0]} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")

    run()  # warm: the page cache and numba's on-disk cache, as on a second run
    return timed(run, repeat)[0]


def loop_ms() -> float:
    """A fixed pure-Python loop, timed (median of 5, ms): this VM's single-core speed moves by up to 1.6x
    within an hour, and this says how fast the machine ran beside each figure the engine gives."""

    def once() -> float:
        start = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i & 7
        return (time.perf_counter() - start) * 1000

    return statistics.median(once() for _ in range(5))


def engine_row(label: str, out: Path, repeat: int, rate: Callable[[float], str],
               workers: int | None) -> tuple[str, str]:  # fmt: skip
    from parity.shared.compare.engine import compare_dumps
    from parity.shared.compare.options import CompareOptions

    from parity.process_policy import collector_paused, metric_executor

    def run() -> Any:
        # the process policy of the entry points (CLI, worker): the collector paused, a pool handed in
        with collector_paused(), metric_executor(workers) as executor:
            # the table's throughput: the float64 replay of the top calls is measured apart (README: its cost)
            options = CompareOptions(executor=executor, replay_top=0)
            return compare_dumps(out / "npu" / "dump.json", out / "bench" / "dump.json", options)

    loop = loop_ms()
    t, peak, result = timed(run, repeat)
    return (label, f"{rate(t)}  {t:6.2f} s  peak RSS {peak / 2**20:5.0f} MiB  ({len(result.rows)} rows; "
                   f"Python loop {loop:.0f} ms)")  # fmt: skip


def bench_statistics(base: Path, quick: bool, repeat: int) -> list[tuple[str, str]]:
    out = base / "statistics"
    apis = 2_000 if quick else 20_000
    generate_statistics_dumps(out, apis)
    os.sync()  # the kernel writing the files back must not run during the measurement
    rows_a_side = apis * 3
    rows = [("statistics data", f"{apis} APIs, {rows_a_side} rows a side, "
             f"{(out / 'npu' / 'dump.json').stat().st_size / MB:.1f} MB dump.json")]  # fmt: skip

    def rate(t: float) -> str:
        return f"{rows_a_side / t:7.0f} rows/s ({rows_a_side / t / 500:.0f}x msprobe)"

    rows.append(engine_row("compare_dumps (engine)", out, repeat, rate, None))
    indented = base / "statistics-indent1"
    generate_statistics_dumps(indented, apis, indent1=True)
    os.sync()
    size = (indented / "npu" / "dump.json").stat().st_size / MB
    rows.append(engine_row(f"  same, indent=1 as msprobe ({size:.1f} MB)", indented, repeat, rate, None))
    t = cli_seconds(out, max(1, repeat - 1))
    rows.append(("parity compare CLI to xlsx", f"{rate(t)}  {t:6.2f} s  (whole process)"))
    tiny = base / "statistics-tiny"
    generate_statistics_dumps(tiny, 3)
    size = (tiny / "npu" / "dump.json").stat().st_size
    rows += cli_rows(f"a {size / 1000:.0f} KB statistics pair", tiny, repeat, fixed=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a tenth of the data")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--workers", type=int, default=None, help="metric workers (default: all cores)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to build the data, kept and reused by the next run (default: temp)")
    parser.add_argument("--only", choices=["tensor", "statistics"], default=None)
    parser.add_argument("--generate-tensor", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--generate-tiny", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate_tensor:
        generate_tensor_dumps(args.generate_tensor, args.quick)
        return 0
    if args.generate_tiny:
        generate_tiny_dumps(args.generate_tiny)
        return 0
    if args.only is None:
        # Each mode in a fresh process, as the CLI and the job workers run every compare: the tensor phase's
        # heap (numba, freed tensor buffers) would otherwise slow the statistics phase by about a fifth.
        passed = sys.argv[1:]
        for mode in ("tensor", "statistics"):
            subprocess.run([sys.executable, __file__, *passed, "--only", mode], check=True)
        return 0
    base = args.dir or Path(tempfile.mkdtemp(prefix="parity-bench-"))
    try:
        load = os.getloadavg()[0]
        rows: list[tuple[str, str]] = [
            ("machine", f"{os.cpu_count()} cores, load average {load:.1f}, repeat {args.repeat} (median)")
        ]
        if args.only in (None, "tensor"):
            rows += bench_tensor(base, args.quick, args.repeat, args.workers)
            if args.dir is None:  # 1.6 GB no longer needed: its page cache and disk go before the next phase
                shutil.rmtree(base / "tensor", ignore_errors=True)
        if args.only in (None, "statistics"):
            rows += bench_statistics(base, args.quick, args.repeat)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
