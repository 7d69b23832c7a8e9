"""Scale benchmark (not a test): a comparison spread over the workers as one task per rank.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--tensor-gb 4] [--complete-mb 150 20]
                                               [--redis-url redis://...] [--only NAME ...]
                                               [--cache-dir DIR] [--drop-cache]

The generated pairs are kept in ``--cache-dir`` and reused by the next run (the 4 GB tensor pair takes
minutes to write); ``--drop-cache`` deletes them at the end.

Prints, each figure measured on a real ``parity server`` (SQLite, file store) fed over REST:

* ``statistics``: a 16-rank statistics pair (4,000 APIs a rank) compared with 1 and then 2 workers, on the
  local pool and, with ``--redis-url`` (or ``PARITY_TEST_REDIS_URL``), on Celery workers: wall time from
  the comparison's creation to its end (the server's clock), the speed-up, how busy the workers were (the
  share of workers x wall time a task ran), their CPU time, each worker's peak RSS, and the peak staging
  (the bytes laid out in task folders at once, per worker; hard links on a file store, so no bytes are
  copied). The runs are uploaded once per pair; each measurement starts a server on the same data;
* ``tensor``: an 8-rank tensor pair of ``--tensor-gb`` GB in all, on 1 and 2 local workers;
* ``overhead``: 256 ranks of one API each on one worker: wall time per rank, an upper bound of a task's
  fixed cost (claim, lease, staging, rows, merge check);
* ``complete``: the API process's RSS from ``POST /runs/{id}/complete`` until a worker has validated a
  ``--complete-mb`` MB dump.json, the slowest ``/healthz`` answer meanwhile, the server's process tree's
  growth (the API process, its workers and the parsing child, RSS summed, sampled every 100 ms: issue 21 asks
  <= 300 MB and <= 2x the file for a 150 MB file), and the validating worker's peak RSS (and its parsing
  child's, which exits after).

Targets (issue 11): >= 1.7x from 1 to 2 workers on a 2-core machine, worker peak RSS <= 1 GB, staging <= 2
ranks' files per worker, API RSS growth <= 100 MB during the complete, task overhead < 50 ms a rank. On a
machine shared with other jobs the speed-up is distorted: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.factories import DumpBuilder, stats_leaf, write_raw_dump  # noqa: E402
from tests.server.conftest import ServerProcess  # noqa: E402

MB = 1e6


class Sampler:
    """Samples, every 100 ms: the peak RSS and CPU time of each worker process, the API process's RSS, the
    peak of their sum (the server's process tree, when the workers are its descendants), and the bytes in the
    staging folders (per task folder, summed). (Every 50 ms, the sampler and the status polls
    took a tenth of a core from the two workers they measure.)"""

    def __init__(self, api_pid: int | None, worker_pids: Callable[[], list[int]], tmp_dir: Path) -> None:
        self.api_pid, self.worker_pids, self.tmp_dir = api_pid, worker_pids, tmp_dir
        self.worker_peak: dict[int, int] = {}
        self.worker_cpu: dict[int, tuple[float, float]] = {}  # pid -> (first, last) user+system seconds
        self.api_peak = 0
        self.tree_peak = 0
        self.staging_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            tree = 0
            for pid in self.worker_pids():
                try:
                    proc = psutil.Process(pid)
                    rss, cpu = proc.memory_info().rss, sum(proc.cpu_times()[:2])
                except psutil.Error:
                    continue
                tree += rss
                self.worker_peak[pid] = max(self.worker_peak.get(pid, 0), rss)
                self.worker_cpu[pid] = (self.worker_cpu.get(pid, (cpu, cpu))[0], cpu)
            if self.api_pid is not None:
                try:
                    rss = psutil.Process(self.api_pid).memory_info().rss
                except psutil.Error:
                    rss = 0
                tree += rss
                self.api_peak = max(self.api_peak, rss)
            self.tree_peak = max(self.tree_peak, tree)
            self.staging_peak = max(self.staging_peak, _tree_bytes(self.tmp_dir, "task-*"))
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_seconds(self) -> float:
        return sum(last - first for first, last in self.worker_cpu.values())


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


def _tree_rss(root: psutil.Process) -> int:
    """RSS of ``root`` and its descendants, summed."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def _settled_tree_rss(root: psutil.Process, timeout: float = 60.0) -> int:
    """``_tree_rss`` once it holds still (within 2 MB over a second): a baseline, not a start-up."""
    last, deadline = _tree_rss(root), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _tree_rss(root)
        if abs(now - last) < 2 * MB:
            return now
        last = now
    return last


def _children(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


# -- data: generated once into a cache folder, reused by later runs -----------------------------------------


def cached(cache: Path, key: str, build: Callable[[Path], tuple[Path, Path]]) -> tuple[Path, Path]:
    """``build(folder)``'s pair, built once under ``cache/key`` (a ``.complete`` marker says it is whole)."""
    folder = cache / key
    if (folder / ".complete").is_file():
        print(f"reusing {folder}", flush=True)
        return folder / "npu", folder / "gpu"
    shutil.rmtree(folder, ignore_errors=True)
    pair = build(folder)
    (folder / ".complete").touch()
    return pair


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
    """``ranks`` ranks of fp32 tensors of 8 MB each, ``total_bytes`` over both sides (generated one rank at a
    time: memory stays at one rank's tensors)."""
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
    """A statistics dump.json of about ``megabytes`` MB (msprobe's indent=1 layout), shaped as the one of
    issue 21 (150 MB, 452,487 entries): every entry an output, every fourth an input too."""
    from parity.shared.dump.writer import dumps_indent1

    apis = megabytes * 1_000_000 // 318
    leaf = stats_leaf(1.5, -0.5, 0.25, 3.0)
    data = {f"Torch.op{i}.0.forward": {"output": [leaf], **({"input_args": [leaf]} if i % 4 == 0 else {})}
            for i in range(apis)}  # fmt: skip
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    path.mkdir(parents=True, exist_ok=True)
    (path / "dump.json").write_text(dumps_indent1(doc))
    return path


# -- runs ----------------------------------------------------------------------------------------------------


class Celery:
    """``workers`` Celery worker slots: one ``celery worker`` with a prefork pool of that many processes, or
    (``pool="solo"``) that many ``celery worker --pool=solo`` processes, each running its tasks itself."""

    def __init__(self, env: dict[str, str], workers: int, log: Path, level: str = "warning",
                 pool: str = "prefork") -> None:  # fmt: skip
        self.log_path, self.pool = log, pool
        command = [sys.executable, "-m", "celery", "-A", "parity.server.jobs.celery_app", "worker",
                   "-l", level, "--without-gossip", "--without-mingle", f"--pool={pool}"]  # fmt: skip
        if pool == "solo":
            commands = [[*command, "-n", f"bench{i}@%h"] for i in range(workers)]
        else:
            commands = [[*command, f"--concurrency={workers}"]]
        with open(log, "ab") as out:
            self.procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
                          for c in commands]  # fmt: skip

    def worker_pids(self) -> list[int]:
        if self.pool == "solo":
            return [p.pid for p in self.procs]
        return _children(self.procs[0].pid)

    def main_pids(self) -> list[int]:
        """The processes that only receive messages and hand them on (none with the solo pool)."""
        return [] if self.pool == "solo" else [self.procs[0].pid]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@dataclass
class Measured:
    """One comparison as the server saw it: wall time from its creation to its last rank's end (server
    clock, so the status polls' interval does not count), and the workers' occupancy: the share of
    ``workers x wall`` during which a task was running."""

    wall: float
    occupancy: float
    body: dict[str, Any]
    sampler: Sampler
    log: str = ""  # the workers' log, with the tasks' timelines (--trace)
    #: CPU seconds of the processes that are not workers (the server, Celery's main process) meanwhile
    helpers_cpu: dict[str, float] = field(default_factory=dict)
    #: cores' worth of CPU that other jobs on the machine took meanwhile (all CPU time but the benchmark's
    #: own processes', over the time measured): on a shared machine, what a 2-worker figure lost
    others_cores: float = 0.0


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def compare_once(api: httpx.Client, target: str, bench: str, workers: int, sampler: Sampler) -> Measured:
    body = {"target_run": target, "bench_run": bench}
    with sampler:
        cid = api.post("/comparisons", json=body).json()["id"]
        while True:
            found = api.get(f"/comparisons/{cid}").json()
            if found["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.5)  # the wall is the server's clock: a poll costs the server CPU, nothing more
    if found["status"] != "succeeded":
        raise RuntimeError(f"comparison {cid} failed: {found['error']}")
    wall = (_time(found["finished_at"]) - _time(found["created_at"])).total_seconds()
    busy = sum((_time(t["finished_at"]) - _time(t["started_at"])).total_seconds() for t in found["tasks"])
    return Measured(wall, busy / (workers * wall), found, sampler)


class Servers:
    """``parity server`` processes over one data folder: the runs are uploaded once, then each measurement
    starts a server (and Celery workers) with its own backend and worker count on the same database."""

    def __init__(self, data: Path, npu: Path, gpu: Path, trace: bool = False, celery_pool: str = "prefork",
                 database_url: str | None = None) -> None:  # fmt: skip
        self.data, self.npu, self.gpu = data, npu, gpu
        self.trace, self.celery_pool, self.database_url = trace, celery_pool, database_url
        self.runs: tuple[str, str] | None = None

    def compare(self, backend: str, workers: int, redis_url: str | None) -> Measured:
        env = {"PARITY_WORKERS": str(workers)}
        if self.database_url is not None:
            env["PARITY_DATABASE_URL"] = self.database_url
        if backend == "celery":
            assert redis_url is not None
            env |= {"PARITY_JOB_BACKEND": "celery", "PARITY_CELERY_BROKER_URL": redis_url}
        srv = ServerProcess(self.data, env).start()
        celery = None
        if backend == "celery":  # its own log per measurement: the trace reads this one's tasks
            level = "info" if self.trace else "warning"
            celery = Celery(srv.env, workers, self.data / f"celery-{srv.port}.log", level, self.celery_pool)
        try:
            if self.runs is None:
                self.runs = self._upload(srv.url)
            assert srv.proc is not None
            server_pid = srv.proc.pid
            pids = celery.worker_pids if celery else (lambda: _children(server_pid))
            _wait_idle(pids, workers)
            others = {"server": psutil.Process(server_pid)}
            for pid in celery.main_pids() if celery is not None else []:
                others["Celery main process"] = psutil.Process(pid)
            before = {name: sum(p.cpu_times()[:2]) for name, p in others.items()}
            machine, own, started = _busy_cpu(), _own_cpu(), time.perf_counter()
            with srv.client() as api:
                measured = compare_once(
                    api, *self.runs, workers, Sampler(None, pids, self.data / "blobs" / ".tmp")
                )
                measured.helpers_cpu = {n: sum(p.cpu_times()[:2]) - before[n] for n, p in others.items()}
                ours = sum(measured.helpers_cpu.values()) + measured.sampler.cpu_seconds + _own_cpu() - own
                took = time.perf_counter() - started
                measured.others_cores = max(_busy_cpu() - machine - ours, 0.0) / took
                api.delete(f"/comparisons/{measured.body['id']}")  # the next measurement queues a new one
        finally:
            if celery is not None:
                celery.stop()
            srv.stop()
        if self.trace:  # read once the workers have stopped: every line is written
            log = celery.log_path if celery is not None else srv.log_path
            measured.log = log.read_text(errors="replace")
        return measured

    def _upload(self, url: str) -> tuple[str, str]:
        from parity.client.rest import ParityClient
        from parity.client.upload import upload_dump

        with ParityClient(url, timeout=600) as api:
            target = upload_dump(api, self.npu, name="bench-scale-npu", device="npu")
            bench = upload_dump(api, self.gpu, name="bench-scale-gpu", device="gpu")
        return target.id, bench.id


def trace(m: Measured) -> list[str]:
    """Where the workers' time went, from the tasks' timelines in the workers' log (``--trace``): the median
    of each phase of a task, the idle time between one task's end and the next one's start on the same worker
    (split at the broker message's arrival on Celery), and each worker's tasks in order."""
    from parity.server.jobs.timeline import PHASES, parse

    cid = m.body["id"]
    records = [r for r in parse(m.log.splitlines()) if str(r.get("task", "")).startswith(f"{cid}:")]
    runs = [r for r in records if "start" in r]
    received: dict[str, list[float]] = {}
    for r in records:
        if "received" in r:
            received.setdefault(r["task"], []).append(r["received"])
    created = _time(m.body["created_at"]).timestamp()
    if not runs:
        return ["  trace: no task timeline in the workers' log"]
    median = statistics.median
    phases = [p for p in PHASES[1:] if all(p in r for r in runs)]
    pairs = zip(["start", *phases], phases, strict=False)
    spans = {name: [r[name] - r[prev] for r in runs] for prev, name in pairs}
    per_phase = "  ".join(f"{name} {median(xs) * 1000:.0f} ({sum(xs):.2f})" for name, xs in spans.items())
    gaps, waits, handoffs, lines = [], [], [], []
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: r["start"]):
        by_worker.setdefault(r["worker"], []).append(r)
    for worker, tasks in sorted(by_worker.items()):
        cells, previous_end = [], created
        for r in tasks:
            arrived = [t for t in received.get(r["task"], []) if t <= r["start"]]
            gap = r["start"] - previous_end
            if previous_end != created:
                gaps.append(gap)
                if arrived:
                    waits.append(max(arrived[-1] - previous_end, 0.0))
                    handoffs.append(r["start"] - arrived[-1])
            rank = r["task"].split(":", 1)[1]
            cells.append(f"+{gap * 1000:.0f} ms r{rank} {r['end'] - r['start']:.2f} s")
            previous_end = r["end"]
        lines.append(f"    {worker:<24} " + ", ".join(cells))
    ms = lambda xs: f"{median(xs) * 1000:.0f} ms" if xs else "-"  # noqa: E731
    head = [
        f"  trace: {len(runs)} tasks; each phase's median ms (total s): {per_phase}",
        f"  idle between a worker's tasks: median {ms(gaps)}, total {sum(gaps):.2f} s of "
        f"{m.wall * len(by_worker):.2f} s worker time"
        + (f"; end -> next message {ms(waits)}, message -> start {ms(handoffs)}" if waits else ""),
        f"  first start {min(r['start'] for r in runs) - created:.2f} s after creation, "
        f"finished {_time(m.body['finished_at']).timestamp() - max(r['end'] for r in runs):+.2f} s from the "
        f"last task's end; CPU meanwhile: "
        + ", ".join(f"{name} {cpu:.2f} s" for name, cpu in m.helpers_cpu.items()),
        "  per worker: the gap before each task, its rank, its time",
    ]
    return head + lines


def _busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (or stolen by its hypervisor) since it started."""
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def _own_cpu() -> float:
    return sum(psutil.Process().cpu_times()[:2])


def _wait_idle(pids: Callable[[], list[int]], workers: int, timeout: float = 120.0) -> None:
    """Wait until the ``workers`` worker processes have started and gone idle (their CPU time still over
    half a second): a server that has been up has its workers ready, and their start (spawn, imports) is
    not the comparison's time."""

    def cpu() -> tuple[int, float]:
        total, count = 0.0, 0
        for pid in pids():
            try:
                total += sum(psutil.Process(pid).cpu_times()[:2])
                count += 1
            except psutil.Error:
                pass
        return count, total

    deadline = time.monotonic() + timeout
    before = cpu()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu()
        if now[0] >= workers and now[1] - before[1] < 0.02:
            return
        before = now
    raise RuntimeError(f"the {workers} worker(s) did not go idle in {timeout:.0f} s")


def _rank_bytes(step: Path) -> int:
    sizes = [sum(f.stat().st_size for f in r.rglob("*") if f.is_file()) for r in step.glob("rank*")]
    return max(sizes) if sizes else 0


def bench_pairs(
    label: str,
    base: Path,
    npu: Path,
    gpu: Path,
    backends: list[str],
    redis_url: str | None,
    repeat: int = 1,
    traced: bool = False,
    celery_pool: str = "prefork",
    database_url: str | None = None,
) -> list[tuple[str, str]]:
    """1 then 2 workers, ``repeat`` times in turn (so that a change of the machine's load falls on both),
    each measurement printed; then the median of each and the median of the paired ratios."""
    rows = _Printed()
    rank_pair = _rank_bytes(npu / "step0") + _rank_bytes(gpu / "step0")
    servers = Servers(base / f"data-{label.split()[0]}", npu, gpu, trace=traced, celery_pool=celery_pool,
                      database_url=database_url)  # fmt: skip
    database = "postgresql" if database_url else "sqlite"
    try:
        for backend in backends:
            backend_name = f"{'celery ' + celery_pool if backend == 'celery' else backend} ({database})"
            walls: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(repeat):
                for workers in (1, 2):
                    m = servers.compare(backend, workers, redis_url)
                    walls[workers].append(m.wall)
                    peak = max(m.sampler.worker_peak.values(), default=0)
                    staged = m.sampler.staging_peak
                    rows.append(
                        (
                            f"{label} {backend_name} {workers} worker(s)",
                            f"{m.wall:7.2f} s  {m.body['summary']['rows']} rows  busy {m.occupancy:4.0%}  "
                            f"worker CPU {m.sampler.cpu_seconds:6.2f} s  "
                            f"peak RSS {peak / 2**20:5.0f} MiB  peak staging {staged / MB:6.1f} MB = "
                            f"{staged / rank_pair:.2f} rank pairs "
                            f"({staged / rank_pair / workers:.2f} per worker)  "
                            f"load {os.getloadavg()[0]:.1f}  others {m.others_cores:.2f} cores",
                        )
                    )
                    if traced:
                        print("\n".join(trace(m)), flush=True)
            ratios = [one / two for one, two in zip(walls[1], walls[2], strict=True)]
            median = statistics.median
            medians = f"  median of {repeat} pairs ({median(walls[1]):.2f} s / {median(walls[2]):.2f} s)"
            rows.append(
                (
                    f"{label} {backend_name} speed-up 1 -> 2 workers",
                    f"{median(ratios):.2f}x (target >= 1.7x)" + (medians if repeat > 1 else ""),
                )
            )
    finally:
        shutil.rmtree(servers.data, ignore_errors=True)
    return rows


@contextlib.contextmanager
def fresh_database(server_url: str | None) -> Iterator[str | None]:
    """A new database on the PostgreSQL server at ``server_url`` (its URL), dropped after; None for none."""
    if server_url is None:
        yield None
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"parity_bench_{os.getpid()}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def bench_overhead(base: Path, cache: Path, ranks: int) -> list[tuple[str, str]]:
    npu, gpu = cached(cache, f"overhead-{ranks}r", lambda f: statistics_pair(f, ranks, 1))
    servers = Servers(base / "data-overhead", npu, gpu)
    try:
        m = servers.compare("local", 1, None)
    finally:
        shutil.rmtree(servers.data, ignore_errors=True)
    assert m.body["summary"]["ranks"] == list(range(ranks))
    return [
        (
            f"task overhead ({ranks} one-API ranks, 1 worker)",
            f"{m.wall:7.2f} s  = {m.wall / ranks * 1000:5.1f} ms a rank (target < 50 ms)",
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
            server = psutil.Process(srv.proc.pid)
            tree_before = _settled_tree_rss(server)  # the workers import the engine as they start
            before = server.memory_info().rss
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
    tree_growth = sampler.tree_peak - tree_before
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
            f"validation of a {size / MB:.0f} MB dump.json",
            f"server process tree peak +{tree_growth / MB:.0f} MB ({tree_before / MB:.0f} -> "
            f"{sampler.tree_peak / MB:.0f} MB; target <= 2x the file: {2 * size / MB:.0f} MB, and <= 300 MB "
            "for 150 MB)",
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
    parser.add_argument("--complete-mb", type=int, nargs="+", default=[150, 20],
                        help="dump.json sizes for the complete figure (a large one is parsed in a child, "
                        "a small one in the worker)")  # fmt: skip
    parser.add_argument("--redis-url", default=os.environ.get("PARITY_TEST_REDIS_URL"))
    parser.add_argument(
        "--postgres-url", metavar="URL",
        help="run the statistics pair's servers on a fresh database of this PostgreSQL server (created and "
        "dropped here; e.g. make test's PARITY_TEST_POSTGRES_URL) instead of SQLite",
    )  # fmt: skip
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "parity-bench-scale-cache",
        help="where the generated pairs are kept for the next run (default: %(default)s)",
    )
    parser.add_argument("--drop-cache", action="store_true", help="delete the cache folder at the end")
    parser.add_argument("--repeat", type=int, default=1, help="1 and 2 workers this many times in turn")
    parser.add_argument(
        "--backends", nargs="+", choices=["local", "celery"], default=["local", "celery"],
        help="which job backends to measure (celery needs --redis-url)",
    )  # fmt: skip
    parser.add_argument(
        "--celery-pool", choices=["prefork", "solo"], default="prefork",
        help="one prefork worker of N processes, or N solo workers (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--trace", action="store_true", help="print where each worker's time went (the tasks' timelines)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["statistics", "tensor", "overhead", "complete"],
        default=["statistics", "tensor", "overhead", "complete"],
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="parity-bench-scale-"))
    backends = [b for b in args.backends if b == "local" or args.redis_url]
    rows = _Printed()
    rows.append(
        (
            "machine",
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
            f"(shared: other jobs distort the speed-ups)",
        )
    )
    cache = args.cache_dir
    try:
        if "statistics" in args.only:
            apis = 400 if args.quick else 4000
            npu, gpu = cached(cache, f"statistics-16r-{apis}", lambda f: statistics_pair(f, 16, apis))
            label = f"statistics 16 ranks x {apis} APIs"
            with fresh_database(args.postgres_url) as database_url:
                bench_pairs(label, base, npu, gpu, backends, args.redis_url, args.repeat, args.trace,
                            args.celery_pool, database_url)  # fmt: skip
            if "celery" in args.backends and not args.redis_url:
                rows.append(("statistics celery", "skipped: no --redis-url / PARITY_TEST_REDIS_URL"))
        if "tensor" in args.only:
            total = int(args.tensor_gb * (0.1 if args.quick else 1.0) * 1e9)
            npu, gpu = cached(cache, f"tensor-8r-{total}", lambda f: tensor_pair(f, 8, total))
            bench_pairs(f"tensor 8 ranks, {total / 1e9:.1f} GB", base, npu, gpu, ["local"], None, args.repeat,
                        args.trace)  # fmt: skip
        if "overhead" in args.only:
            for row in bench_overhead(base, cache, 256):
                rows.append(row)
        if "complete" in args.only:
            for megabytes in args.complete_mb:
                for row in bench_complete(base, megabytes // (10 if args.quick else 1)):
                    rows.append(row)
        rows.append(("machine after", f"load average {os.getloadavg()[0]:.1f}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if args.drop_cache:
            shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
