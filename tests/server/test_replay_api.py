"""The float64 replay on the server: a comparison's worker replays its top suspects, ``GET
/comparisons/{id}/replay`` serves the verdicts (by rank and entry), and the comparison page shows each one
beside its suspect. Dumps are made by Parity's client; the target's gelu kernel is wrong."""

from __future__ import annotations

import html

import httpx
import pytest

from tests.replay_dumps import GELU, dump_model, wrong_forward_gelu
from tests.server.conftest import ServerProcess, upload_run, wait_comparison


@pytest.fixture(scope="module")
def comparison(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("replay_server")
    bench_dump = dump_model(root / "bench")
    target_dump = dump_model(root / "target", gelu=wrong_forward_gelu())
    with server.client() as api:
        bench = upload_run(api, bench_dump.parents[2], device="cpu")
        target = upload_run(api, target_dump.parents[2], device="gpu")
        resp = api.post("/comparisons", json={"target_run": target["id"], "bench_run": bench["id"]})
        assert resp.status_code == 202, resp.text
        done = wait_comparison(api, resp.json()["id"])
    assert done["status"] == "succeeded", done["error"]
    return done


def test_the_verdicts_are_stored_with_the_comparison(api: httpx.Client, comparison: dict[str, object]
                                                     ) -> None:  # fmt: skip
    cid = comparison["id"]
    summary = comparison["summary"]
    assert isinstance(summary, dict)
    assert summary["top_suspects"][0]["api"] == GELU
    resp = api.get(f"/comparisons/{cid}/replay")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["count"] == len(body["data"]) == len(summary["replay"]) >= 1
    gelu = next(v for v in body["data"] if v["entry"] == GELU)
    assert gelu["verdict"] == "target" and gelu["compare_rank"] == 0
    assert gelu["text"].endswith("the target's kernel is wrong")
    assert gelu["target"]["distance"] > gelu["target"]["allowance"] > gelu["bench"]["distance"]
    one = api.get(f"/comparisons/{cid}/replay", params={"entry": GELU, "rank": 0}).json()
    assert [v["entry"] for v in one["data"]] == [GELU]
    assert api.get(f"/comparisons/{cid}/replay", params={"rank": 7}).json()["count"] == 0


def test_unknown_comparison_and_bad_query(api: httpx.Client, comparison: dict[str, object]) -> None:
    assert api.get("/comparisons/nope/replay").status_code == 404
    assert api.get(f"/comparisons/{comparison['id']}/replay", params={"rank": -1}).status_code == 422


def test_the_page_shows_the_verdict_beside_the_suspect(server: ServerProcess,
                                                       comparison: dict[str, object]) -> None:  # fmt: skip
    resp = httpx.get(f"{server.url}/comparisons/{comparison['id']}", timeout=60, follow_redirects=True)
    assert resp.status_code == 200, resp.text[:500]
    page = html.unescape(resp.text)
    suspects = page[page.index('id="suspects"'):page.index('id="chart-card"')]
    first = suspects[suspects.index(f"<code>{GELU}</code>"):]
    first = first[:first.index("</li>")]
    assert "float64 replay: target" in first and "the target's kernel is wrong" in first
