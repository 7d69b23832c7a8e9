"""The pages in a real headless Chromium: walk from the runs to a run and its comparison, use the filters,
see the chart drawn and the rows coloured, and check that nothing is fetched from another origin, nothing
is logged to the console as an error, and a run name made of HTML is shown as text and runs nothing."""

from __future__ import annotations

import re
from typing import Any

from tests.web.conftest import XSS_NAME, Seeded

RED = "rgb(255, 127, 127)"


def assert_clean(page: Any) -> None:
    assert page.console_errors == [], page.console_errors
    assert page.foreign_requests() == [], page.foreign_requests()


def test_walk_from_runs_to_a_comparison(seeded: Seeded, open_page: Any) -> None:
    page = open_page(seeded.server.url)
    p = page.page
    p.goto(seeded.server.url + "/", wait_until="networkidle")
    assert p.locator("#runs tbody tr").count() >= 5
    # Newest first: the multi-rank runs were created after the others.
    names = p.locator("#runs a.run-link").all_inner_texts()
    assert names.index("gpu-3ranks") < names.index("npu-3ranks") < names.index("npu-bf16")

    p.get_by_role("link", name="npu-bf16", exact=True).click()
    p.wait_for_load_state("networkidle")
    assert p.locator("#run-name").inner_text().startswith("npu-bf16")
    assert "def456" in p.locator("#metadata").inner_text()  # the git commit the client recorded
    assert p.locator("#write-controls").count() == 1  # sign-in is off: everyone may write

    p.locator("a.comparison-link").first.click()
    p.wait_for_load_state("networkidle")
    assert p.url.endswith(f"/comparisons/{seeded.comparison['id']}")
    chart = p.locator("#chart")
    p.locator("#chart[data-drawn='1']").wait_for()  # a selector: the CSP allows no eval
    assert int(chart.get_attribute("data-points") or 0) >= 3
    assert chart.get_attribute("data-divergence") == "1"  # Torch.relu.0.forward, the second call
    # A call whose error is exactly zero is drawn in the row under the log scale's floor, not on it.
    rel = p.evaluate("fetch(document.getElementById('chart').dataset.callsUrl).then(r => r.json())")["rel"]
    assert int(chart.get_attribute("data-zeros") or -1) == sum(1 for v in rel if v == 0) >= 1  # the linear
    assert "Torch.relu.0.forward" in p.locator("#suspects .first-divergence").inner_text()

    red = p.locator("#rows tbody tr.hl-red")
    assert red.count() >= 1
    assert red.first.locator("td").first.evaluate("td => getComputedStyle(td).backgroundColor") == RED
    assert p.locator("#counts").inner_text().count("fail") == 1
    assert_clean(page)

    # A click on the first divergence's point leads to that call's rows.
    x = p.evaluate("document.getElementById('chart').chartX(1)")
    chart.click(position={"x": x, "y": 100})
    p.wait_for_url(re.compile(r"name=Torch\.relu\.0\.forward"))
    names = p.locator("#rows tbody tr td:nth-child(2)").all_inner_texts()
    assert names and all(n.startswith("Torch.relu.0.forward") for n in names)
    assert_clean(page)


def test_filters_live_in_the_url(seeded: Seeded, open_page: Any) -> None:
    page = open_page(seeded.server.url)
    p = page.page
    p.goto(seeded.server.url + "/", wait_until="networkidle")
    p.locator("#run-filters input[name=name]").fill("npu")
    p.locator("#run-filters select[name=device]").select_option("npu")
    p.locator("#run-filters button[type=submit]").click()
    p.wait_for_url(re.compile(r"name=npu"))
    assert "device=npu" in p.url
    names = p.locator("#runs a.run-link").all_inner_texts()
    assert sorted(names) == ["npu-3ranks", "npu-bf16"]

    # The same URL opened afresh shows the same view.
    other = open_page(seeded.server.url).page
    other.goto(p.url, wait_until="networkidle")
    assert sorted(other.locator("#runs a.run-link").all_inner_texts()) == ["npu-3ranks", "npu-bf16"]

    p.goto(f"{seeded.server.url}/comparisons/{seeded.comparison['id']}", wait_until="networkidle")
    total = p.locator("#rows tbody tr").count()
    p.locator("#diff-only").check()  # submits by itself
    p.wait_for_url(re.compile(r"diff=true"))
    statuses = p.locator("#rows tbody tr").evaluate_all("rows => rows.map(r => r.className)")
    assert 0 < len(statuses) < total
    assert all("rs-fail" in s or "rs-unmatched" in s for s in statuses)
    assert_clean(page)


def test_an_html_run_name_is_shown_as_text(seeded: Seeded, open_page: Any) -> None:
    page = open_page(seeded.server.url)
    p = page.page
    for path in ("/", f"/runs/{seeded.xss['id']}", "/?project=sec"):
        p.goto(seeded.server.url + path, wait_until="networkidle")
        assert XSS_NAME in p.locator("main").inner_text()
        assert p.locator("main img").count() == 0
        assert p.evaluate("window.pwned") is None
    assert "<b>t</b>" in p.locator("main").inner_text()  # a tag value too
    assert_clean(page)


def test_several_ranks_get_a_heatmap(seeded: Seeded, open_page: Any) -> None:
    page = open_page(seeded.server.url)
    p = page.page
    p.goto(f"{seeded.server.url}/comparisons/{seeded.multi['id']}", wait_until="networkidle")
    heat = p.locator("#heatmap table.heat")
    assert heat.locator("tbody tr").count() == 3
    assert "Torch.relu.0.forward" in heat.locator("thead").inner_text()
    p.locator("#chart-card .ranks a", has_text="2").click()
    p.wait_for_url(re.compile(r"rank=2"))
    p.locator("#chart[data-drawn='1']").wait_for()  # a selector: the CSP allows no eval
    assert_clean(page)


def test_baseline_regressions_accept_and_history(seeded: Seeded, open_page: Any) -> None:
    """Mark a baseline from its page, let a completed run be compared with it on its own, accept a new
    failing API with a note there, and follow the API to its history."""
    from tests.server.conftest import build_dump, upload_run, wait_comparison

    page = open_page(seeded.server.url)
    p = page.page
    with seeded.server.client() as api:
        base = upload_run(api, build_dump(seeded.server.data_dir / "b"), name="reg-base", project="reg")
    p.goto(f"{seeded.server.url}/runs/{base['id']}", wait_until="networkidle")
    p.locator("#baseline-form button").click()
    p.wait_for_load_state("networkidle")
    assert "baseline of reg" in p.locator("#run-name").inner_text()

    with seeded.server.client() as api:
        bad = upload_run(api, build_dump(seeded.server.data_dir / "r", perturb=0.5), name="reg-new",
                         project="reg")  # fmt: skip
        found = []
        for _ in range(100):
            found = api.get("/comparisons", params={"run": bad["id"]}).json()["data"]
            if found:
                break
            p.wait_for_timeout(100)
        comparison = wait_comparison(api, found[0]["id"])
    p.goto(f"{seeded.server.url}/comparisons/{comparison['id']}", wait_until="networkidle")
    regressions = p.locator("#regressions")
    relu = regressions.locator("tr", has_text="Torch.relu.0.forward")
    assert relu.locator(".badge").inner_text() == "new"
    relu.locator("input[name=note]").fill("<script>window.pwned=1</script> known bf16 effect")
    relu.locator("button").click()
    p.wait_for_load_state("networkidle")
    relu = p.locator("#regressions tr", has_text="Torch.relu.0.forward")
    assert relu.locator(".badge").inner_text() == "known"
    assert "<script>window.pwned=1</script> known bf16 effect" in relu.inner_text()
    assert p.evaluate("window.pwned") is None

    relu.get_by_role("link", name="Torch.relu.0.forward").click()
    p.wait_for_url(re.compile(r"/apis/history"))
    p.locator("#history-chart[data-drawn='1']").wait_for()  # a selector: the CSP allows no eval
    assert p.locator("#history tbody tr").count() == 1
    assert_clean(page)


def test_bad_links_get_a_page_that_says_why(seeded: Seeded) -> None:
    import httpx

    cid = seeded.comparison["id"]
    for path, status, text in (
        ("/runs/<b>nope", 404, "run &#39;&lt;b&gt;nope&#39; not found"),
        (f"/comparisons/{cid}?status=weird", 400, "status: &#39;weird&#39; is not one of"),
        (f"/comparisons/{cid}?rank=7", 400, "rank: 7 is not in comparison"),
        ("/?page=0", 422, "query.page"),
    ):
        resp = httpx.get(seeded.server.url + path)
        assert resp.status_code == status and resp.headers["content-type"].startswith("text/html"), path
        assert text in resp.text, resp.text
        assert "default-src 'self'" in resp.headers["content-security-policy"]


def test_downloads_from_the_comparison_page(seeded: Seeded) -> None:
    import httpx

    cid = seeded.comparison["id"]
    base = f"{seeded.server.url}/comparisons/{cid}/download"
    xlsx = httpx.get(f"{base}/report.xlsx?rank=0")
    assert xlsx.status_code == 200 and xlsx.content[:2] == b"PK"  # a zip: an xlsx workbook
    assert f"report_{cid[:8]}_rank0.xlsx" in xlsx.headers["content-disposition"]
    advisor = httpx.get(f"{base}/advisor.txt?rank=0")
    assert advisor.status_code == 200 and "Torch.relu.0.forward" in advisor.text
    summary = httpx.get(f"{base}/summary.json")
    assert summary.status_code == 200
    assert summary.json()["summary"]["rows"] == seeded.comparison["summary"]["rows"]
    assert httpx.get(f"{base}/secrets.txt").status_code == 400
