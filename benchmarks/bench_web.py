"""Web pages benchmark: the comparison page of a 1,000,000-row comparison and the runs page with 10,000 runs.

A fresh ``parity server`` on its embedded defaults (SQLite, file store) is seeded straight through the ORM
(a million rows over REST would take the upload and the compare job, which ``bench_server.py`` measures):
10,000 runs, and one succeeded tensor-mode comparison of 4 ranks x 250,000 rows whose calls are indexed as the
worker indexes them. Then, for each page:

- TTFB: the time from sending the request to the first byte of the body (``httpx``, a fresh connection
  each time), over ``--requests`` requests;
- browser load: headless Chromium opens the page and waits for network idle; the figure is the page's own
  clock from navigation start to the later of ``loadEventEnd`` and the last resource's ``responseEnd`` (the
  chart's data included), so Playwright's 500 ms quiet window is not counted.

Targets: comparison page p95 < 1 s, runs page p95 < 500 ms (both figures). The page variants measured are the
first page, a filtered view (differences only; a name substring) and a deep page.

Run: ``.venv/bin/python benchmarks/bench_web.py [--rows N] [--runs N] [--requests N] [--loads N]
[--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx

from parity.demo import ServerProcess

HEADER = [
    "NPU Name",
    "Bench Name",
    "NPU Dtype",
    "Bench Dtype",
    "NPU Tensor Shape",
    "Bench Tensor Shape",
    "NPU Requires_grad",
    "Bench Requires_grad",
    "Cosine",
    "EucDist",
    "MaxAbsErr",
    "MaxRelativeErr",
    "One Thousandth Err Ratio",
    "Five Thousandths Err Ratio",
    "NPU max",
    "NPU min",
    "NPU mean",
    "NPU l2norm",
    "Bench max",
    "Bench min",
    "Bench mean",
    "Bench l2norm",
    "Requires_grad Consistent",
    "Accuracy Reached or Not",
    "Err_message",
    "Data_name",
    "Parity Status",
    "Parity API",
]
APIS = [
    "Functional.linear",
    "Torch.matmul",
    "Tensor.add",
    "Functional.gelu",
    "Functional.layer_norm",
    "Torch.softmax",
    "Tensor.mul",
    "Functional.dropout",
]


def seed(data_dir: Path, rows: int, runs: int, ranks: int = 4) -> str:
    """Fill a fresh data dir; returns the comparison's id."""
    from parity.server.db import Database
    from parity.server.migrate import upgrade
    from parity.server.models import Comparison, ComparisonRow, Run, RunTag, utcnow
    from parity.server.services.calls import index_comparison
    from parity.server.settings import Settings
    from sqlalchemy import insert

    settings = Settings(data_dir=data_dir)
    upgrade(settings.resolved_database_url)
    db = Database.connect(settings.resolved_database_url)
    rng = random.Random(0)
    now = utcnow()
    run_rows, tag_rows = [], []
    for i in range(runs):
        run_id = uuid.uuid4().hex
        device = ("npu", "gpu")[i % 2]
        run_rows.append(
            {
                "id": run_id,
                "name": f"llama-{device}-{i:05d}",
                "project": f"proj-{i % 20}",
                "device": device,
                "tags": {"hw": device, "dtype": "bf16" if i % 3 else "fp32"},
                "meta": {"torch_version": "2.13.0"},
                "status": "complete",
                "created_at": now - timedelta(seconds=runs - i),
                "completed_at": now,
                "baseline": False,
                "auto_compare": True,
            }
        )
        tag_rows += [
            {"run_id": run_id, "key": "hw", "value": device},
            {"run_id": run_id, "key": "dtype", "value": "bf16" if i % 3 else "fp32"},
        ]
    with db.write() as session:
        for start in range(0, len(run_rows), 5000):
            session.execute(insert(Run), run_rows[start : start + 5000])
            session.execute(insert(RunTag), tag_rows[2 * start : 2 * start + 10000])
    cid = uuid.uuid4().hex
    target, bench = run_rows[-1]["id"], run_rows[-2]["id"]
    per_rank = rows // ranks
    suspect = "Functional.gelu.1234.forward"
    with db.write() as session:
        session.add(
            Comparison(
                id=cid,
                target_run_id=target,
                bench_run_id=bench,
                step=0,
                ranks=None,
                options={},
                status="succeeded",
                progress=1.0,
                created_at=now,
                started_at=now,
                finished_at=now,
                attempt=1,
                against_baseline=False,
                headers={str(r): HEADER for r in range(ranks)},
                summary={
                    "rows": per_rank * ranks,
                    "failing_rows": 0,
                    "failing_apis": [suspect],
                    "ranks": list(range(ranks)),
                    "mode": "tensor",
                    "top_suspects": [
                        {
                            "rank": 0,
                            "api": suspect,
                            "direction": "forward",
                            "row_index": 0,
                            "reason": "inputs agree, output does not",
                            "stack": "File model.py, line 42",
                            "compare_rank": 0,
                        }
                    ],
                },
            )
        )
    table = ComparisonRow.__table__
    for rank in range(ranks):
        batch = []
        for index in range(per_rank):
            call, slot = divmod(index, 4)  # 3 inputs and 1 output per call
            api = f"{APIS[call % len(APIS)]}.{call // len(APIS)}.{'backward' if call % 5 == 4 else 'forward'}"
            io = "output.0" if slot == 3 else f"input.{slot}"
            name = f"{api}.{io}"
            rel = rng.random() * 1e-5 if rng.random() > 0.002 else rng.random()
            status = "fail" if rel > 0.01 else ("warning" if rel > 5e-5 else "pass")
            cos = 1 - rel / 10
            cells = [
                name,
                name,
                "torch.bfloat16",
                "torch.float32",
                "[4096, 4096]",
                "[4096, 4096]",
                False,
                False,
                cos,
                rel * 3,
                rel,
                rel,
                0.99,
                0.999,
                1.5,
                -1.5,
                0.01,
                123.4,
                1.5,
                -1.5,
                0.01,
                123.4,
                True,
                "No" if status == "fail" else "Yes",
                "",
                f"{name}.pt",
                status,
                api,
            ]
            batch.append(
                {
                    "comparison_id": cid,
                    "rank": rank,
                    "index": index,
                    "api": api,
                    "status": status,
                    "highlight": "red" if status == "fail" else ("yellow" if status == "warning" else None),
                    "name": name,
                    "failing": status == "fail",
                    "cells": json.dumps(cells, separators=(",", ":")),
                }
            )
            if len(batch) >= 20000:
                with db.write() as session:
                    session.execute(insert(table), batch)
                batch = []
        if batch:
            with db.write() as session:
                session.execute(insert(table), batch)
    started = time.perf_counter()
    index_comparison(db, cid)
    took = time.perf_counter() - started
    print(f"seed: {runs} runs, {per_rank * ranks} rows; calls indexed in {took:.1f} s")
    db.dispose()
    return cid


def ttfb(url: str, requests: int) -> list[float]:
    out = []
    for _ in range(requests):
        with httpx.Client(timeout=60) as client:
            start = time.perf_counter()
            with client.stream("GET", url) as resp:
                chunks = resp.iter_raw()
                next(chunks)
                out.append(time.perf_counter() - start)
                assert resp.status_code == 200, (url, resp.status_code)
                for _chunk in chunks:
                    pass
    return out


def browser_loads(url: str, loads: int, chromium: str, *, repeat: bool) -> list[float]:
    """``loads`` page loads, each in a fresh browser context (an empty cache); ``repeat``: the page is opened
    once first in that context and the second load is measured (the stylesheet and script then come from
    the browser's cache, as on a person's every visit but the first)."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(loads):
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            if repeat:
                page.goto(url, wait_until="networkidle", timeout=120_000)
                page.goto("about:blank")
            page.goto(url, wait_until="networkidle", timeout=120_000)
            ms = page.evaluate("""() => {
                const nav = performance.getEntriesByType('navigation')[0];
                const last = Math.max(0, ...performance.getEntriesByType('resource').map(e => e.responseEnd));
                return Math.max(nav.loadEventEnd, last);
            }""")
            out.append(ms / 1000)
            context.close()
        browser.close()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(label: str, values: list[float], target: float) -> bool:
    p50, p95 = statistics.median(values), pct(values, 0.95)
    ok = p95 < target
    print(
        f"{label:<58} p50 {p50 * 1000:7.1f} ms  p95 {p95 * 1000:7.1f} ms  (n={len(values)}, target p95 < "
        f"{target * 1000:.0f} ms: {'met' if ok else 'MISSED'})"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=40, help="TTFB samples per page")
    parser.add_argument("--loads", type=int, default=12, help="browser loads per page")
    parser.add_argument("--keep", type=Path, help="seed into (or reuse) this data dir and keep it")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="parity-bench-web-"))
    marker = work / "bench-web.json"
    if marker.exists():
        cid = json.loads(marker.read_text())["comparison"]
    else:
        cid = seed(work, args.rows, args.runs)
        marker.write_text(json.dumps({"comparison": cid}))
    server = ServerProcess(work, env={"PARITY_WORKERS": "0"})
    base = server.start()
    ok = True
    try:
        pages = [
            ("runs page, 10,000 runs", "/", 0.5),
            ("runs page, filtered (name, device, tag)", "/?name=npu-01&device=npu&tag=dtype%3Dbf16", 0.5),
            ("comparison page, 1,000,000 rows", f"/comparisons/{cid}", 1.0),
            ("comparison page, differences only", f"/comparisons/{cid}?diff=true", 1.0),
            ("comparison page, name filter", f"/comparisons/{cid}?name=gelu.12", 1.0),
            ("comparison page, page 5,000", f"/comparisons/{cid}?page=5000", 1.0),
        ]
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average at start: {load} ({os.cpu_count()} cores; the machine is shared)")
        # The first view after a start pays for cold caches (SQLite's pages, the row counts, the heatmap and
        # the chart's series, built once per comparison); it is reported apart, then the pages are warm.
        print("first view after the server started (TTFB of one request, whole response for the chart):")
        cold = [*pages, ("comparison chart data, rank 0", f"/comparisons/{cid}/calls.json?rank=0", 1.0)]
        for label, path, _target in cold:
            started = time.perf_counter()
            httpx.get(base + path, timeout=300).raise_for_status()
            print(f"  {label:<56} {(time.perf_counter() - started) * 1000:7.1f} ms")
        print("TTFB (server, first byte):")
        for label, path, target in pages:
            ok &= report(f"  {label}", ttfb(base + path, args.requests), target)
        for repeat in (False, True):
            visit = "repeat visit, assets cached" if repeat else "first visit, empty cache"
            print(f"browser load to network idle (headless Chromium, {visit}):")
            for label, path, target in pages[:1] + pages[2:4]:
                loads = browser_loads(base + path, args.loads, args.chromium, repeat=repeat)
                ok &= report(f"  {label}", loads, target)
    finally:
        server.stop()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
