"""Sign-in with ``PARITY_TOKENS`` in a real Chromium: the pages ask for a token once and keep a signed,
HttpOnly, SameSite=Strict cookie with an expiry; a read-only token sees no write controls and its writes are
refused; form posts need the page's CSRF token and our own origin."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from parity.server.settings import Settings

from tests.server.conftest import ServerProcess, build_dump, upload_run
from tests.workers import validation_thread

RW, RO = "rw-secret-token", "ro-secret-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("signin")
    server = ServerProcess(root / "srv", {"PARITY_TOKENS": f"{RW},{RO}:ro", "PARITY_WORKERS": "0"}).start()
    try:
        # No worker on the server: the run is validated by one in this process, on the same data folder.
        with server.client(RW) as api, validation_thread(Settings(data_dir=root / "srv")):
            run = upload_run(api, build_dump(root / "dump"), name="guarded-run", project="p")
        yield server, run
    finally:
        server.stop()


def sign_in(p: Any, url: str, token: str, path: str = "/") -> None:
    p.goto(url + path, wait_until="networkidle")
    assert "/login" in p.url
    p.locator("#login-form input[name=token]").fill(token)
    p.locator("#login-form button[type=submit]").click()
    p.wait_for_load_state("networkidle")


def test_pages_ask_for_a_token_once(guarded: tuple[ServerProcess, dict[str, Any]], open_page: Any) -> None:
    server, run = guarded
    page = open_page(server.url)
    p = page.page
    sign_in(p, server.url, "not-a-token", f"/runs/{run['id']}")
    assert "Unknown token" in p.locator(".error").inner_text()
    # The refused sign-in answered 401, which Chromium logs; that one is expected, nothing after it.
    assert [e for e in page.console_errors if "401" not in e] == []
    page.console_errors.clear()
    p.locator("#login-form input[name=token]").fill(RW)
    p.locator("#login-form button[type=submit]").click()
    p.wait_for_url(f"{server.url}/runs/{run['id']}")  # back where the person was going
    assert p.locator("#write-controls").count() == 1

    cookie = next(c for c in p.context.cookies() if c["name"] == "parity_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert time.time() < cookie["expires"] < time.time() + 13 * 3600
    assert RW not in cookie["value"]
    assert p.evaluate("document.cookie") == ""  # nothing for a script to steal

    p.goto(server.url + "/", wait_until="networkidle")  # signed in: no second prompt
    assert "/login" not in p.url and p.locator("#runs").count() == 1

    # An error page keeps the signed-in header (issue 36: it dropped it), sign-out and all.
    p.goto(server.url + "/?tag=hw:gpu", wait_until="networkidle")
    assert "'hw:gpu' is not KEY=VALUE" in p.locator(".error").inner_text()
    assert p.locator("#sign-out").count() == 1 and p.locator(".who").inner_text()
    assert [e for e in page.console_errors if "400" not in e] == []
    page.console_errors.clear()

    # A forged or tampered cookie is worth nothing.
    value = cookie["value"]
    p.context.add_cookies([{**cookie, "value": value[:-2] + ("AA" if value[-2:] != "AA" else "BB")}])
    p.goto(server.url + "/", wait_until="networkidle")
    assert "/login" in p.url
    assert page.console_errors == [] and page.foreign_requests() == []


def test_read_only_token_sees_no_write_controls(
    guarded: tuple[ServerProcess, dict[str, Any]], open_page: Any
) -> None:
    server, run = guarded
    page = open_page(server.url)
    p = page.page
    sign_in(p, server.url, RO, f"/runs/{run['id']}")
    assert "read-only" in p.locator(".who").inner_text()
    assert p.locator("#write-controls").count() == 0
    assert p.locator("main form[method=post]").count() == 0

    # Its writes are refused even with a valid CSRF token (the sign-out form's).
    csrf = p.locator(".signout input[name=csrf]").get_attribute("value")
    resp = p.request.post(f"{server.url}/runs/{run['id']}/edit", form={"csrf": csrf, "name": "renamed"},
                          headers={"Origin": server.url})  # fmt: skip
    assert resp.status == 403 and "read-only" in resp.text()
    with server.client(RO) as api:
        assert api.patch(f"/runs/{run['id']}", json={"name": "renamed"}).status_code == 403
        assert api.get(f"/runs/{run['id']}").json()["name"] == "guarded-run"


def test_form_posts_need_csrf_and_our_origin(
    guarded: tuple[ServerProcess, dict[str, Any]], open_page: Any
) -> None:
    server, run = guarded
    p = open_page(server.url).page
    sign_in(p, server.url, RW, f"/runs/{run['id']}")
    csrf = p.locator("#edit-form input[name=csrf]").get_attribute("value")
    url = f"{server.url}/runs/{run['id']}/edit"
    assert p.request.post(url, form={"name": "x"}, headers={"Origin": server.url}).status == 403
    assert p.request.post(url, form={"csrf": "forged" * 7 + "a", "name": "x"}).status == 403
    evil = p.request.post(url, form={"csrf": csrf, "name": "x"}, headers={"Origin": "https://evil.example"})
    assert evil.status == 403
    with server.client(RW) as api:
        assert api.get(f"/runs/{run['id']}").json()["name"] == "guarded-run"

    # Through the page itself, the edit goes through.
    p.locator("#edit-form input[name=name]").fill("renamed-in-browser")
    p.locator("#edit-form button[type=submit]").click()
    p.wait_for_load_state("networkidle")
    assert p.locator("#run-name").inner_text().startswith("renamed-in-browser")


def test_a_queued_comparison_page_follows_its_status(
    guarded: tuple[ServerProcess, dict[str, Any]], open_page: Any
) -> None:
    """No worker runs here (``PARITY_WORKERS=0``): the page shows the job queued and keeps asking."""
    server, run = guarded
    with server.client(RW) as api:
        resp = api.post("/comparisons", json={"target_run": run["id"], "bench_run": run["id"]})
        assert resp.status_code == 202, resp.text
    page = open_page(server.url)
    p = page.page
    sign_in(p, server.url, RO, f"/comparisons/{resp.json()['id']}")
    assert p.locator("#job-status").inner_text() == "queued"
    assert p.locator("#job-progress").count() == 1
    with p.expect_response(lambda r: r.url.endswith("/status.json") and r.status == 200, timeout=10_000):
        pass
    assert p.locator("#table").count() == 0  # no rows before it succeeded
    assert page.console_errors == [] and page.foreign_requests() == []


def test_signing_out_ends_the_session_on_the_server(
    guarded: tuple[ServerProcess, dict[str, Any]], open_page: Any
) -> None:
    """The cookie saved before "Sign out" signs no one in after it; "Sign out everywhere" ends the token's
    sessions in other browsers too."""
    server, run = guarded
    p = open_page(server.url).page
    sign_in(p, server.url, RW, f"/runs/{run['id']}")
    saved = next(c for c in p.context.cookies() if c["name"] == "parity_session")
    p.locator("#sign-out").click()
    p.wait_for_url(f"{server.url}/login")
    assert not [c for c in p.context.cookies() if c["name"] == "parity_session"]
    p.context.add_cookies([saved])
    p.goto(server.url + "/", wait_until="networkidle")
    assert "/login" in p.url

    other = open_page(server.url).page
    sign_in(other, server.url, RO)
    sign_in(p, server.url, RO)
    p.locator("#sign-out-everywhere").click()
    p.wait_for_url(f"{server.url}/login")
    other.goto(server.url + "/", wait_until="networkidle")
    assert "/login" in other.url
