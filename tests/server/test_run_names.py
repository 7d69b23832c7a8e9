"""``POST /runs`` and ``PATCH /runs/{run}`` apply the shared name and tag rule: trimmed, or a 422 naming the
field (``parity.shared.naming``; the client and ``parity upload`` refuse the same names before sending)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from parity.server.main import create_app
from parity.server.settings import Settings

API = "/api/v1"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data", workers=0))) as test_client:
        yield test_client


def test_a_name_with_spaces_around_is_stored_trimmed_and_addressable(client: TestClient) -> None:
    resp = client.post(f"{API}/runs", json={"name": "  nightly 4  ", "project": " mlp ", "device": "cpu",
                                            "tags": {" hw ": " gpu "}})  # fmt: skip
    assert resp.status_code == 201, resp.text
    run = resp.json()
    assert (run["name"], run["project"], run["tags"]) == ("nightly 4", "mlp", {"hw": "gpu"})
    assert client.get(f"{API}/runs/nightly%204").json()["id"] == run["id"]
    assert client.delete(f"{API}/runs/nightly%204").status_code == 204


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"name": "  nightly 4 / x  "}, "name", "holds a '/'"),
        ({"name": ".."}, "name", "removed from URL paths"),
        ({"name": "a\tb"}, "name", "control character U+0009"),
        ({"name": "ok", "project": "team/mlp"}, "project", "holds a '/'"),
        ({"name": "ok", "tags": {"note": "x" * 2000}}, "tags", "at most 1024"),
        ({"name": "ok", "tags": {"a=b": "c"}}, "tags", "holds no '='"),
        ({"name": "ok", "tags": {f"k{i}": "v" for i in range(65)}}, "tags", "at most 64"),
    ],
)
def test_a_name_no_route_could_address_is_422_naming_the_field(
    client: TestClient, body: dict, field: str, words: str
) -> None:
    resp = client.post(f"{API}/runs", json={"device": "cpu", **body})
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert detail.startswith(f"body.{field}") and words in detail and "Value error" not in detail, detail
    assert client.get(f"{API}/runs").json()["count"] == 0


def test_a_rename_follows_the_same_rule(client: TestClient) -> None:
    run = client.post(f"{API}/runs", json={"name": "r1", "device": "cpu"}).json()
    resp = client.patch(f"{API}/runs/{run['id']}", json={"name": "r/2"})
    assert resp.status_code == 422 and "holds a '/'" in resp.json()["detail"]
    resp = client.patch(f"{API}/runs/{run['id']}", json={"name": " r2 ", "tags": {" k ": "v"}})
    assert resp.status_code == 200 and (resp.json()["name"], resp.json()["tags"]) == ("r2", {"k": "v"})


def test_look_alike_names_are_refused_as_duplicates(client: TestClient) -> None:
    """Issue 37: invisible format characters are refused, fullwidth letters are NFKC-normalised, and a name
    that looks like one the project has (Cyrillic letters for Latin ones) is a duplicate of it."""
    first = client.post(f"{API}/runs", json={"name": "nightly", "device": "cpu"}).json()
    invisibles = (("nigh\u200btly", "U+200B"), ("\u202enightly", "U+202E"), ("\ufeffnightly", "U+FEFF"))
    for invisible, code in invisibles:
        resp = client.post(f"{API}/runs", json={"name": invisible, "device": "cpu"})
        assert resp.status_code == 422 and f"invisible format character {code}" in resp.json()["detail"]
    for alike in ("ｎｉｇｈｔｌｙ", "n\u0456ghtly", "nightl\u0443", "ni\u0261htly"):
        resp = client.post(f"{API}/runs", json={"name": alike, "device": "cpu"})
        assert resp.status_code == 409, resp.text
        assert "already has a run named 'nightly'" in resp.json()["detail"] and first["id"] in resp.text
    other = client.post(f"{API}/runs", json={"name": "weekly", "device": "cpu"}).json()
    resp = client.patch(f"{API}/runs/{other['id']}", json={"name": "n\u0456ghtly"})
    assert resp.status_code == 409 and "(which 'n\u0456ghtly' looks like)" in resp.json()["detail"]
    elsewhere = client.post(f"{API}/runs", json={"name": "nightly", "project": "other", "device": "cpu"})
    assert elsewhere.status_code == 201
    assert client.get(f"{API}/runs").json()["count"] == 3
