"""The team's daily loop in a real headless Chromium (issues 25 and 36): a float32 baseline set by name, three
bfloat16 nightlies compared with it on their own, the third with a regression on one GELU call. The runs list
marks the third worse and the second clean at a glance (and the baseline); the third's run page opens with
its comparison against the baseline, files folded. Its comparison page opens with what changed since the
previous comparison, above the fold, the ``worse`` GELU first with its error before and after; the chart
marks it; the statistics-mode rows are coloured and their columns that matter come first; accepting it and
revoking the acceptance works from the page. Tags read and link ``KEY=VALUE``, and filter by it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture(scope="module")
def nightlies(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The baseline and three nightlies' comparisons against it, on the module's server (project mlp)."""
    tmp_path = tmp_path_factory.mktemp("nightlies")
    with seeded.server.client() as api:
        upload_run(api, mlp_dump(tmp_path / "base"), name="mlp-cpu-fp32", project="mlp", device="cpu",
                   tags={"dtype": "fp32"})  # fmt: skip
        assert api.patch("/runs/mlp-cpu-fp32", json={"baseline": True}).status_code == 200  # by name
        nightly = mlp_dump(tmp_path / "nightly", bf16=True)
        worse = mlp_dump(tmp_path / "worse", bf16=True, gelu_off=0.05)
        comparisons = []
        for k, dump in enumerate((nightly, nightly, worse), 1):
            run = upload_run(api, dump, name=f"mlp-nightly-{k}", project="mlp", device="cpu",
                             tags={"variant": "bf16-layer", "night": str(k)})  # fmt: skip
            comparisons.append(auto_comparison(api, run["id"]))
    assert all(c["status"] == "succeeded" and c["against_baseline"] for c in comparisons)
    return comparisons


def test_the_runs_list_says_which_run_regressed(
    seeded: Seeded, nightlies: list[dict[str, Any]], open_page: Any
) -> None:
    page = open_page(seeded.server.url)
    p = page.page
    p.goto(f"{seeded.server.url}/?project=mlp", wait_until="networkidle")
    header = p.locator("#runs thead th").all_inner_texts()
    assert header[:2] == ["Name", "Against baseline"], header
    rows = {r.locator("a.run-link").inner_text(): r for r in p.locator("#runs tbody tr").all()}
    assert list(rows) == ["mlp-nightly-3", "mlp-nightly-2", "mlp-nightly-1", "mlp-cpu-fp32"]

    def verdict(name: str) -> str:
        return rows[name].locator("td.against .badge").inner_text().lower()

    assert [verdict(n) for n in rows] == ["worse", "clean", "new", "baseline"]
    assert rows["mlp-nightly-3"].locator("td.against").inner_text().endswith("2 worse, 3 known")
    assert rows["mlp-nightly-2"].locator("td.against").inner_text().endswith("5 known")
    # At a glance: the worse run's row is tinted and its badge dark red; the clean one's is neither.
    tint = "td => getComputedStyle(td).backgroundColor"
    worse_bg = rows["mlp-nightly-3"].locator("td").nth(2).evaluate(tint)
    clean_bg = rows["mlp-nightly-2"].locator("td").nth(2).evaluate(tint)
    assert worse_bg != clean_bg, (worse_bg, clean_bg)
    assert clean_bg in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"), clean_bg
    assert rows["mlp-nightly-3"].locator("td.against .badge").evaluate(tint) == "rgb(179, 20, 27)"
    # The badge links the comparison judged.
    link = rows["mlp-nightly-3"].locator("a.verdict-link").get_attribute("href")
    assert link == f"/comparisons/{nightlies[-1]['id']}"
    shots = os.environ.get("PARITY_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(Path(shots) / "runs-verdicts.png"))
        (Path(shots) / "runs-verdicts.txt").write_text(p.locator("#runs").inner_text())

    # Tags read KEY=VALUE, link KEY=VALUE, and the link filters (it was a 400 for key:value).
    tag = rows["mlp-nightly-3"].locator("a.tag", has_text="variant=bf16-layer")
    assert tag.inner_text() == "variant=bf16-layer"
    tag.click()
    p.wait_for_load_state("networkidle")
    assert "tag=variant%3Dbf16-layer" in p.url
    assert p.locator("#runs a.run-link").all_inner_texts() == ["mlp-nightly-3", "mlp-nightly-2",
                                                               "mlp-nightly-1"]  # fmt: skip
    assert p.locator("input[name=tag]").input_value() == "variant=bf16-layer"
    # A filter that is not KEY=VALUE is a 400 page saying so, header and all.
    p.goto(f"{seeded.server.url}/?tag=variant:bf16-layer", wait_until="networkidle")
    assert "'variant:bf16-layer' is not KEY=VALUE" in p.locator(".error").inner_text()
    assert p.locator("header.top nav a").inner_text() == "Runs"
    assert page.console_errors == ["Failed to load resource: the server responded with a status of 400 "
                                   "(Bad Request)"]  # that one is expected, nothing else  # fmt: skip
    page.console_errors.clear()

    # The regressed run's page opens with its comparison against the baseline; the files are folded.
    p.goto(f"{seeded.server.url}/runs/{nightlies[-1]['target_run']}", wait_until="networkidle")
    first = p.locator("main section.card").first
    assert first.get_attribute("id") == "against-baseline"
    assert "Against the baseline mlp-cpu-fp32: WORSE 2 worse, 3 known" in first.locator("h2").inner_text()
    assert first.locator("#against-changed tbody tr").first.locator("code").inner_text() == GELU
    assert p.locator("#files").is_visible() is False
    top = p.locator("#run-comparisons tbody tr").first
    assert top.locator(".badge.verdict").inner_text().lower() == "worse"
    assert p.locator("dl.kv").first.inner_text().count("step 0") == 1
    if shots:
        p.screenshot(path=str(Path(shots) / "run-against-baseline.png"))
    assert_clean(page)


def test_a_worse_regression_is_the_first_thing_on_the_page(
    seeded: Seeded, nightlies: list[dict[str, Any]], open_page: Any
) -> None:
    comparisons = nightlies
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
    # Its labels never overlap (the first divergence's and the marks' were drawn over each other), and
    # the name of the call under the pointer shows beside it.
    labels = p.evaluate("JSON.parse(document.getElementById('chart').dataset.labels)")
    assert len(labels) >= 2
    for k, a in enumerate(labels):
        for b in labels[k + 1:]:
            apart = a["right"] <= b["left"] or b["right"] <= a["left"] or a["bottom"] <= b["top"] \
                or b["bottom"] <= a["top"]  # fmt: skip
            assert apart, (a, b)
    chart = p.locator("#chart")
    x = p.evaluate(f"document.getElementById('chart').chartX("
                   f"document.getElementById('chart').chartApi.indexOf('{GELU}'))")  # fmt: skip
    chart.hover(position={"x": x, "y": 150})
    tip = p.locator("#chart-tip")
    assert tip.is_visible() and tip.inner_text() == GELU
    assert "Excel row " in p.locator("#chart-info").inner_text()

    # Statistics mode: failing rows are red, and the columns that matter come first.
    header = p.locator("#rows thead th").all_inner_texts()
    expected = ["Excel row", "NPU Name", "Parity Status", "MaxRelativeErr", "NormRelativeErr"]
    assert header[:5] == expected, header
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
