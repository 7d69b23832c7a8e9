"""Fixtures for the web pages: a real ``parity server`` (SQLite, one worker) seeded over REST with runs and
comparisons, and a headless Chromium (Debian's ``chromium``, driven by Playwright) that records every
request and console message of each page it opens."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import ServerProcess, build_dump, upload_run, wait_comparison

XSS_NAME = '<img src=x onerror="window.pwned=1">'
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str:
    """Debian's chromium (``scripts/chromium.sh`` installs it); in CI its absence fails, elsewhere skips."""
    for candidate in (os.environ.get("PARITY_CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is missing in CI: scripts/test.sh must install it (scripts/chromium.sh)")
    pytest.skip("chromium not installed (run the suite through scripts/test.sh)")


@dataclass
class Seeded:
    server: ServerProcess
    target: dict[str, Any]
    bench: dict[str, Any]
    xss: dict[str, Any]
    comparison: dict[str, Any]
    multi: dict[str, Any] = field(default_factory=dict)


def seed(server: ServerProcess, root: Path) -> Seeded:
    with server.client() as api:
        good = build_dump(root / "good")
        bad = build_dump(root / "bad", perturb=0.5)
        bench = upload_run(api, good, name="gpu-fp32", project="llama", device="gpu", tags={"hw": "gpu"},
                           metadata={"torch_version": "2.13.0", "hostname": "gpu-box", "git_commit": "abc123",
                                     "packages": {"torch": "2.13.0", "numpy": "2.1.0"}})  # fmt: skip
        npu_meta = {"torch_version": "2.13.0", "hostname": "npu-box", "git_commit": "def456",
                    "packages": {"torch": "2.13.0", "numpy": "2.2.0", "torch_npu": "2.13"}}  # fmt: skip
        target = upload_run(api, bad, name="npu-bf16", project="llama", device="npu", tags={"hw": "npu"},
                            metadata=npu_meta)  # fmt: skip
        xss = upload_run(api, good, name=XSS_NAME, project="sec", device="cpu", tags={"x": "<b>t</b>"})
        resp = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
        assert resp.status_code == 202, resp.text
        comparison = wait_comparison(api, resp.json()["id"])
        assert comparison["status"] == "succeeded", comparison
        multi_bad = build_dump(root / "mbad", perturb=0.5, ranks=(0, 1, 2))
        multi_good = build_dump(root / "mgood", ranks=(0, 1, 2))
        mt = upload_run(api, multi_bad, name="npu-3ranks", project="llama", device="npu")
        mb = upload_run(api, multi_good, name="gpu-3ranks", project="llama", device="gpu")
        resp = api.post("/comparisons", json={"target_run": mt["id"], "bench_run": mb["id"]})
        multi = wait_comparison(api, resp.json()["id"])
        assert multi["status"] == "succeeded", multi
    return Seeded(server, target, bench, xss, comparison, multi)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    root = tmp_path_factory.mktemp("web")
    server = ServerProcess(root / "srv").start()
    try:
        yield seed(server, root)
    finally:
        server.stop()


class Page:
    """A page of the headless browser with everything it requested and every console error it logged."""

    def __init__(self, page: Any, origin: str) -> None:
        self.page = page
        self.origin = origin
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        page.on("request", lambda req: self.requests.append(req.url))
        page.on("console", lambda msg: msg.type == "error" and self.console_errors.append(msg.text))
        page.on("pageerror", lambda exc: self.console_errors.append(str(exc)))

    def foreign_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith((self.origin + "/", "data:"))]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    contexts = []

    def open_(origin: str) -> Page:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = Page(context.new_page(), origin)
        page.page.set_default_timeout(20_000)
        return page

    yield open_
    for context in contexts:
        context.close()
