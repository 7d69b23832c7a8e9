"""Runs whose call traces differ (issue 24) on the server: the target fuses attention into one call, the
bench computes it explicitly; the comparison's summary and its page show the faulty gap as one suspect with
its two sides."""

from __future__ import annotations

import html

import httpx
import pytest

from tests.gap_dumps import SDPA, fused_pair
from tests.server.conftest import ServerProcess, upload_run, wait_comparison

GAP = f"target {SDPA}.1.forward ~ bench Tensor.transpose.1.forward ... Torch.matmul.3.forward"


@pytest.fixture(scope="module")
def comparison(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("gaps")
    fused_pair(root / "target" / "step0" / "rank0", root / "bench" / "step0" / "rank0", fault=True)
    with server.client() as api:
        bench = upload_run(api, root / "bench", device="cpu")
        target = upload_run(api, root / "target", device="npu")
        resp = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
        assert resp.status_code == 202, resp.text
        done = wait_comparison(api, resp.json()["id"])
    assert done["status"] == "succeeded", done["error"]
    return done


def test_the_gap_is_the_top_suspect_with_its_two_sides(server: ServerProcess,
                                                       comparison: dict[str, object]) -> None:  # fmt: skip
    summary = comparison["summary"]
    assert isinstance(summary, dict)
    top = summary["top_suspects"][0]
    assert (top["api"], top["gap"]) == (f"{SDPA}.1.forward", GAP)
    resp = httpx.get(f"{server.url}/comparisons/{comparison['id']}", timeout=60, follow_redirects=True)
    assert resp.status_code == 200, resp.text[:500]
    page = html.unescape(resp.text)
    suspects = page[page.index('id="suspects"') : page.index('id="chart-card"')]
    item = suspects[suspects.index('<span class="badge gap">gap</span>') :]
    item = item[: item.index("</li>")]
    assert f"<code>target {SDPA}.1.forward</code></a> ~ <code>bench Tensor.transpose.1.forward ... " in item
    assert "calls without a partner, judged as one" in item
