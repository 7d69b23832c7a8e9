"""The team's daily loop in a real headless Chromium (issue 25): a float32 baseline set by name, three
bfloat16 nightlies compared with it on their own, the third with a regression on one GELU call. Its
comparison page opens with what changed since the previous comparison, above the fold, the ``worse`` GELU
first with its error before and after; the chart marks it; the statistics-mode rows are coloured and their
columns that matter come first; accepting it and revoking the acceptance works from the page."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tests.server.conftest import upload_run, wait_comparison
from tests.server.nightly import GELU, mlp_dump
from tests.web.conftest import Seeded
from tests.web.test_pages_browser import RED, assert_clean

VIEWPORT_HEIGHT = 1000  # the ``open_page`` fixture's window


def auto_comparison(api: Any, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = api.get("/comparisons", params={"run": run_id}).json()["data"]
        if found:
            return wait_comparison(api, found[0]["id"])
        time.sleep(0.1)
    raise AssertionError(f"no comparison was queued for run {run_id}")


def test_a_worse_regression_is_the_first_thing_on_the_page(
    seeded: Seeded, open_page: Any, tmp_path: Path
) -> None:
    with seeded.server.client() as api:
        upload_run(api, mlp_dump(tmp_path / "base"), name="mlp-cpu-fp32", project="mlp", device="cpu")
        assert api.patch("/runs/mlp-cpu-fp32", json={"baseline": True}).status_code == 200  # by name
        nightly = mlp_dump(tmp_path / "nightly", bf16=True)
        worse = mlp_dump(tmp_path / "worse", bf16=True, gelu_off=0.05)
        comparisons = []
        for k, dump in enumerate((nightly, nightly, worse), 1):
            run = upload_run(api, dump, name=f"mlp-nightly-{k}", project="mlp", device="cpu")
            comparisons.append(auto_comparison(api, run["id"]))
    assert all(c["status"] == "succeeded" and c["against_baseline"] for c in comparisons)
    last = comparisons[-1]

    page = open_page(seeded.server.url)
    p = page.page
    p.goto(f"{seeded.server.url}/runs/{last['target_run']}", wait_until="networkidle")
    p.locator("a.comparison-link").first.click()
    p.wait_for_load_state("networkidle")
    assert p.url.endswith(f"/comparisons/{last['id']}")

    # The first card of the page is what changed, and it is on the first screen.
    first_card = p.locator("main section.card").first
    assert first_card.get_attribute("id") == "changed"
    box = first_card.bounding_box()
    assert box is not None and box["y"] + box["height"] <= VIEWPORT_HEIGHT, box
    assert "2 worse, 0 new, 0 fixed; 3 known" in p.locator("#changed h2").inner_text()
    rows = p.locator("#changed-list tbody tr")
    top = rows.first
    assert top.locator(".badge").inner_text() == "worse"
    assert GELU in top.inner_text()
    before, after = (float(top.locator("td").nth(i).inner_text()) for i in (2, 3))
    assert 0 < before < 0.005 and after > 0.04, (before, after)
    assert p.locator("#changed h2").inner_text().startswith("What changed since the previous comparison")
    previous = p.locator("#changed a").first.get_attribute("href") or ""
    assert previous == f"/comparisons/{comparisons[1]['id']}"  # the second nightly's comparison
    shots = os.environ.get("PARITY_SCREENSHOTS")
    if shots:  # the first screen, for the record (the closing note)
        Path(shots).mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(Path(shots) / "nightly-regression-first-screen.png"))
        first_screen = p.evaluate("""() => [...document.querySelectorAll('main h1, main section.card')]
            .filter(e => e.getBoundingClientRect().top < window.innerHeight)
            .map(e => e.innerText).join('\\n----\\n')""")
        (Path(shots) / "nightly-regression-first-screen.txt").write_text(first_screen)

    # The chart marks the calls that got worse.
    p.locator("#chart[data-drawn='1']").wait_for()  # a selector: the CSP allows no eval
    marked = p.evaluate("JSON.parse(document.getElementById('chart').dataset.marked)")
    assert marked[0] == GELU and "Functional.linear.2.forward" in marked

    # Statistics mode: failing rows are red, and the columns that matter come first.
    header = p.locator("#rows thead th").all_inner_texts()
    assert header[:5] == ["#", "NPU Name", "Parity Status", "MaxRelativeErr", "NormRelativeErr"], header
    failing = p.locator("#rows tbody tr.rs-fail")
    assert failing.count() >= 5
    assert failing.first.locator("td").nth(1).evaluate("td => getComputedStyle(td).backgroundColor") == RED

    # Accepted with a note at its level, then revoked: known, then worse again.
    gelu = p.locator("#regressions tr", has_text=GELU)
    gelu.locator("input[name=note]").fill("bf16 GELU, checked by hand")
    gelu.locator("button", has_text="Accept").click()
    p.wait_for_load_state("networkidle")
    gelu = p.locator("#regressions tr", has_text=GELU)
    assert gelu.locator(".badge").inner_text() == "known"
    assert "bf16 GELU, checked by hand" in gelu.inner_text()
    gelu.locator("button", has_text="Revoke").click()
    p.wait_for_load_state("networkidle")
    assert p.locator("#regressions tr", has_text=GELU).locator(".badge").inner_text() == "worse"

    # From the GELU to its history: one line per step and mode, against time.
    p.locator("#regressions a", has_text=GELU).first.click()
    p.wait_for_url(lambda url: "/apis/history" in url)
    p.locator("#history-chart[data-drawn='1']").wait_for()  # a selector: the CSP allows no eval
    assert p.locator("#history-chart").get_attribute("data-lines") == "1"
    assert p.locator("#history tbody tr").count() == 3
    assert_clean(page)
