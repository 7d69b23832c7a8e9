"""Screenshots of the web pages for docs/screenshots/: a throwaway server seeded as the browser tests seed it,
plus a baseline, a run compared with it on completion, and an accepted API; headless Debian chromium.

Run: ``.venv/bin/python scripts/web_screenshots.py [OUT_DIR]`` (default ``docs/screenshots``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.server.conftest import ServerProcess, build_dump, upload_run, wait_comparison  # noqa: E402
from tests.web.conftest import seed  # noqa: E402


def main() -> int:
    from playwright.sync_api import sync_playwright

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="parity-shots-"))
    server = ServerProcess(root / "srv").start()
    try:
        seeded = seed(server, root)
        with server.client() as api:
            api.patch(f"/runs/{seeded.bench['id']}", json={"baseline": True})
            meta = {"torch_version": "2.14.0.dev", "git_commit": "0a1b2c3", "hostname": "npu-box",
                    "packages": {"torch": "2.14.0.dev", "numpy": "2.2.0"}}  # fmt: skip
            run = upload_run(api, build_dump(root / "again", perturb=0.3), name="npu-bf16-nightly",
                             project="llama", device="npu", tags={"hw": "npu", "build": "nightly"},
                             metadata=meta)  # fmt: skip
            deadline = time.monotonic() + 60
            while not (found := api.get("/comparisons", params={"run": run["id"]}).json()["data"]):
                assert time.monotonic() < deadline, "no comparison against the baseline"
                time.sleep(0.2)
            auto = wait_comparison(api, found[0]["id"])
            note = {"api": "Torch.sum.0.forward", "note": "the sum of a noisier relu; follows it"}
            api.post("/projects/llama/acceptances", json=note)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            for name, path in (("runs", "/"), ("run", f"/runs/{run['id']}"),
                               ("comparison", f"/comparisons/{auto['id']}"),
                               ("comparison-ranks", f"/comparisons/{seeded.multi['id']}")):  # fmt: skip
                page.goto(server.url + path, wait_until="networkidle")
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
            browser.close()
    finally:
        server.stop()
    print(f"screenshots in {out}")  # noqa: T201 - a script's one line of output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
