"""Issue 26: web sign-in that can be revoked and cannot be guessed, against a live ``parity server``.

1. sessions live on the server: logout, "sign out everywhere" and a token's removal end them for good, and the
   CSRF token changes at sign-in and sign-out;
2. nothing in the cookie or on the page helps guess a token (a random id; an HMAC fingerprint);
3. wrong tokens from one address (REST and the form, counted together) are slowed, then answered 429 with
   Retry-After, each logged once without the token; the address is the connection's unless a trusted proxy is
   configured (a rotated ``X-Forwarded-For`` changes nothing then);
4. a non-ASCII or huge token is a 401, never a 500;
5. no-store and nosniff on every answer, /docs not framable, the logout cookie's attributes, acceptances
   recording the signed-in identity, Secure cookies with ``PARITY_HTTPS_ONLY`` or a trusted proxy's https.

Each test comes from its own client address (``X-Forwarded-For``: the guarded server trusts the test on
127.0.0.1 as its proxy, ``PARITY_FORWARDED_ALLOW_IPS``), so one test's wrong tokens never slow or block
another's requests; a server with the default (no proxy trusted) counts the connection's address.
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import httpx
import pytest
from parity.server.settings import Settings

from tests.server.conftest import (
    ServerProcess,
    build_dump,
    fresh_postgres_database,
    postgres_url_or_skip,
    upload_run,
)
from tests.workers import validation_thread

RW = "alice-rw-9f3b1c2d7e8a4b6c0d1e2f3a4b5c6d7e"  # named "alice"
RW2 = "ci-rw-0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b"  # no name: shown by its fingerprint
RO = "viewer-ro-5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c"
SHORT = "Zq9xK"  # read-only, named "tiny": accepted with a warning at start
SECRET = "s" * 16 + "ecret-key-of-the-test-server-26"
LIMIT = 5
TOKENS = f"{RW}:rw:alice,{RW2}:rw,{RO}:ro,{SHORT}:ro:tiny"


def fingerprint(token: str, key: str = SECRET) -> str:
    return "token " + hmac.new(key.encode(), b"token:" + token.encode(), hashlib.sha256).hexdigest()[:12]


class Browser:
    """A browser as the server sees it: its cookies (kept by hand: httpx would hold back Secure ones over
    plain http) and its address."""

    def __init__(self, url: str, address: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"X-Forwarded-For": address}, timeout=60)
        self.cookies: dict[str, str] = {}
        self.set_cookies: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        resp = self.http.request(method, path, headers=headers, **kwargs)
        self.http.cookies.clear()
        self.set_cookies = resp.headers.get_list("set-cookie")
        for header in self.set_cookies:
            for name, morsel in SimpleCookie(header).items():
                if morsel["max-age"] == "0":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return resp

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, form: dict[str, str]) -> httpx.Response:
        return self.request("POST", path, data={"csrf": self.cookies.get("parity_csrf", ""), **form})

    def sign_in(self, token: str) -> httpx.Response:
        if "parity_csrf" not in self.cookies:
            assert self.get("/login").status_code == 200
        return self.post("/login", {"token": token, "next": "/"})

    def cookie_header(self, name: str) -> str:
        """The Set-Cookie header of the last response for cookie ``name``."""
        return next(h for h in self.set_cookies if h.startswith(f"{name}="))

    def close(self) -> None:
        self.http.close()


def address() -> str:
    """A client address of its own for each test (in 2001:db8::/32, the documentation prefix)."""
    h = uuid.uuid4().hex
    return f"2001:db8:{h[:4]}:{h[4:8]}::{h[8:12]}"


@dataclass
class Guarded:
    server: ServerProcess
    run: dict[str, Any]
    comparison: str


def record_calls(settings: Settings, comparison_id: str, apis: Sequence[str]) -> None:
    from parity.server.db import Database
    from parity.server.models import ComparisonCall

    db = Database.connect(settings.resolved_database_url)
    try:
        with db.write() as session:
            session.add_all(
                ComparisonCall(comparison_id=comparison_id, rank=0, seq=seq, api=api, backward=False,
                               status="fail", max_rel_err=0.5, one_minus_cos=None, first_row=seq)
                for seq, api in enumerate(apis)
            )  # fmt: skip
    finally:
        db.dispose()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def guarded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    root = tmp_path_factory.mktemp(f"signin-{request.param}")
    env = {"PARITY_TOKENS": TOKENS, "PARITY_WORKERS": "0", "PARITY_SESSION_SECRET": SECRET,
           "PARITY_AUTH_FAILURE_LIMIT": str(LIMIT), "PARITY_AUTH_FAILURE_DELAY_SECONDS": "0.01",
           "PARITY_FORWARDED_ALLOW_IPS": "127.0.0.1"}  # fmt: skip
    database_url = None
    if request.param == "postgres":
        database_url = env["PARITY_DATABASE_URL"] = fresh_postgres_database(postgres_url_or_skip())
    server = ServerProcess(root / "srv", env).start()
    try:
        # No worker on the server: the run is validated by one in this process, on the same database.
        validator = Settings(data_dir=root / "srv", database_url=database_url)
        with server.client(RW) as api, validation_thread(validator):
            run = upload_run(api, build_dump(root / "dump"), name="guarded-run", project="p26")
            resp = api.post("/comparisons", json={"target_run": run["id"], "bench_run": run["id"]})
            assert resp.status_code == 202, resp.text
        # The comparison stays queued; the APIs the tests accept are recorded as its calls (an API that no
        # comparison of the project had cannot be accepted).
        record_calls(validator, resp.json()["id"], ("Torch.a.0.forward", "Torch.b.0.forward"))
        yield Guarded(server, run, resp.json()["id"])
    finally:
        server.stop()


@pytest.fixture
def browser(guarded: Guarded) -> Iterator[Browser]:
    b = Browser(guarded.server.url, address())
    yield b
    b.close()


def other_browser(guarded: Guarded) -> Browser:
    return Browser(guarded.server.url, address())


# -- 1. server-side sessions ---------------------------------------------------------------------------------
def test_logout_ends_the_session_for_good(guarded: Guarded, browser: Browser) -> None:
    assert browser.sign_in(RW).status_code == 303
    stolen = dict(browser.cookies)  # a copy of the cookies, as a backup or a proxy log would keep them
    page = browser.get("/")
    assert page.status_code == 200 and "alice" in page.text

    assert browser.post("/logout", {}).headers["location"] == "/login"
    deleted = browser.cookie_header("parity_session")
    for attribute in ("Max-Age=0", "Path=/", "HttpOnly", "SameSite=strict"):
        assert attribute in deleted, deleted
    assert "parity_session" not in browser.cookies

    thief = other_browser(guarded)
    thief.cookies = stolen
    resp = thief.get("/")
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login")
    edit = thief.post(f"/runs/{guarded.run['id']}/edit", {"name": "renamed-after-logout"})
    assert edit.status_code == 303 and edit.headers["location"].startswith("/login")
    assert thief.get(f"/comparisons/{guarded.comparison}/status.json").status_code == 401
    with guarded.server.client(RW) as api:
        assert api.get(f"/runs/{guarded.run['id']}").json()["name"] == "guarded-run"


def test_sign_out_everywhere_ends_every_session_of_the_token(guarded: Guarded) -> None:
    laptop, desktop, viewer = other_browser(guarded), other_browser(guarded), other_browser(guarded)
    for b, token in ((laptop, RW2), (desktop, RW2), (viewer, RO)):
        assert b.sign_in(token).status_code == 303
        assert b.get("/").status_code == 200
    resp = laptop.post("/logout", {"everywhere": "1"})
    assert resp.status_code == 303
    assert "Max-Age=0" in laptop.cookie_header("parity_session")
    assert desktop.get("/").status_code == 303  # the other browser of that token is signed out too
    assert viewer.get("/").status_code == 200  # another token's session is not
    for b in (laptop, desktop, viewer):
        b.close()


def test_csrf_token_changes_at_sign_in_and_sign_out(guarded: Guarded, browser: Browser) -> None:
    assert browser.get("/login").status_code == 200
    before = browser.cookies["parity_csrf"]
    assert browser.sign_in(RW).status_code == 303
    signed_in = browser.cookies["parity_csrf"]
    assert signed_in != before
    page = browser.get(f"/runs/{guarded.run['id']}")
    assert f'value="{signed_in}"' in page.text and before not in page.text
    # A form made before sign-in (its CSRF field the old token) is refused now.
    stale = browser.request("POST", f"/runs/{guarded.run['id']}/edit", data={"csrf": before, "name": "x"})
    assert stale.status_code == 403
    assert browser.post("/logout", {}).status_code == 303
    assert browser.cookies["parity_csrf"] not in (before, signed_in)


def test_a_session_ends_when_its_token_is_removed_and_survives_a_restart(tmp_path: Path) -> None:
    """Without PARITY_SESSION_SECRET the key is kept in the database: a restart keeps sessions, and a
    token taken out of PARITY_TOKENS ends its sessions at the next start."""
    data = tmp_path / "srv"
    first = ServerProcess(data, {"PARITY_TOKENS": f"{RW}:rw:alice,{RO}:ro", "PARITY_WORKERS": "0"}).start()
    try:
        writer, viewer = Browser(first.url, address()), Browser(first.url, address())
        assert writer.sign_in(RW).status_code == 303 and viewer.sign_in(RO).status_code == 303
        assert viewer.get("/").status_code == 200
    finally:
        first.stop()
    with sqlite3.connect(data / "parity.db") as db:
        assert db.execute("SELECT count(*) FROM web_sessions").fetchone() == (2,)
    second = ServerProcess(data, {"PARITY_TOKENS": f"{RW}:rw:alice", "PARITY_WORKERS": "0",
                                  "PARITY_HTTPS_ONLY": "1"}).start()  # fmt: skip
    try:
        with sqlite3.connect(data / "parity.db") as db:
            assert db.execute("SELECT count(*) FROM web_sessions").fetchone() == (1,)
        for b in (writer, viewer):
            b.http = httpx.Client(base_url=second.url, headers=b.http.headers, timeout=60)
        assert viewer.get("/").status_code == 303
        assert writer.get("/").status_code == 200  # the same cookie, across the restart

        # PARITY_HTTPS_ONLY: Secure on every cookie, though this request came over plain http.
        fresh = Browser(second.url, address())
        assert fresh.get("/login").status_code == 200
        assert "Secure" in fresh.cookie_header("parity_csrf")
        assert fresh.sign_in(RW).status_code == 303
        assert all("Secure" in fresh.cookie_header(name) for name in ("parity_session", "parity_csrf"))
        fresh.post("/logout", {})
        deleted = fresh.cookie_header("parity_session")
        assert all(a in deleted for a in ("Max-Age=0", "Secure", "HttpOnly", "Path=/", "SameSite=strict"))
    finally:
        second.stop()
    assert RW not in second.log() and RO not in second.log() and RO not in first.log()


# -- 2. nothing guessable ------------------------------------------------------------------------------------
def test_cookie_and_pages_hold_nothing_to_test_a_guess_against(guarded: Guarded, browser: Browser) -> None:
    assert browser.sign_in(RO).status_code == 303
    first = browser.cookies["parity_session"]
    again = other_browser(guarded)
    assert again.sign_in(RO).status_code == 303
    second = again.cookies["parity_session"]
    assert first != second and len(first) == len(second) == 43  # 32 random bytes, nothing else
    digest = hashlib.sha256(RO.encode()).hexdigest()
    for value in (first, second):
        assert RO not in value and digest[:8] not in value
    page = browser.get("/").text
    assert fingerprint(RO) in page and "read-only" in page
    assert digest[:8] not in page and RO not in page
    # Keyed: a server with another key would show another fingerprint for the same token.
    assert fingerprint(RO) != fingerprint(RO, "another-key-" + "x" * 32)
    again.close()


# -- 3. limited guessing -------------------------------------------------------------------------------------
def test_wrong_tokens_are_slowed_then_answered_429(guarded: Guarded, browser: Browser) -> None:
    where = browser.http.headers["X-Forwarded-For"]
    api = f"{guarded.server.url}/api/v1/runs"
    headers = {"X-Forwarded-For": where}
    guesses = [f"guess-{i}-{uuid.uuid4().hex}" for i in range(LIMIT)]
    for guess in guesses[:3]:  # REST and the form count together
        assert httpx.get(api, headers={**headers, "Authorization": f"Bearer {guess}"}).status_code == 401
    for guess in guesses[3:]:
        assert browser.sign_in(guess).status_code == 401
    for attempt in (
        httpx.get(api, headers={**headers, "Authorization": f"Bearer {RW}"}),  # even the right token
        browser.sign_in(RW),
    ):
        assert attempt.status_code == 429, attempt.text
        assert 0 < int(attempt.headers["Retry-After"]) <= 600
    assert "try again in" in browser.sign_in(RW).text
    # Another address is not held back.
    elsewhere = {"X-Forwarded-For": address(), "Authorization": f"Bearer {RW}"}
    assert httpx.get(api, headers=elsewhere).status_code == 200

    log = guarded.server.log()
    lines = [line for line in log.splitlines() if f"wrong token from {where} " in line]
    assert len(lines) == LIMIT  # each failure once; the 429s are not failures
    assert "(REST): 1 of 5" in lines[0] and "(web): 5 of 5" in lines[-1]
    assert "answered after 0.00 s" in lines[2] and "answered after 0.01 s" in lines[3]  # slowed from the 4th
    assert "answered after 0.02 s" in lines[4] and "limit reached" in lines[4]
    assert not any(guess in log for guess in guesses)


def test_without_a_trusted_proxy_a_rotated_forwarded_for_is_the_same_address(tmp_path: Path) -> None:
    """The default (``PARITY_FORWARDED_ALLOW_IPS`` unset): the wrong-token throttle counts the connection's
    address, so a new ``X-Forwarded-For`` per guess neither spreads the guesses nor lets the right token
    through from the locked-out address; nor is a claimed https believed."""
    env = {"PARITY_TOKENS": TOKENS, "PARITY_WORKERS": "0", "PARITY_SESSION_SECRET": SECRET,
           "PARITY_AUTH_FAILURE_LIMIT": str(LIMIT), "PARITY_AUTH_FAILURE_DELAY_SECONDS": "0"}  # fmt: skip
    server = ServerProcess(tmp_path / "srv", env).start()
    try:
        api = f"{server.url}/api/v1/runs"
        for i in range(LIMIT):
            headers = {"X-Forwarded-For": address(), "Authorization": f"Bearer guess-{i}-{uuid.uuid4().hex}"}
            assert httpx.get(api, headers=headers).status_code == 401
        right = httpx.get(api, headers={"X-Forwarded-For": address(), "Authorization": f"Bearer {RW}"})
        assert right.status_code == 429, right.text
        assert "too many wrong tokens from 127.0.0.1" in right.text
        lines = [line for line in server.log().splitlines() if "wrong token from " in line]
        assert len(lines) == LIMIT and all("wrong token from 127.0.0.1 (REST)" in line for line in lines)
        login = httpx.get(f"{server.url}/login", headers={"X-Forwarded-Proto": "https"})
        assert "Secure" not in login.headers["set-cookie"]
    finally:
        server.stop()


def test_a_short_token_is_accepted_with_a_warning(guarded: Guarded) -> None:
    log = guarded.server.log()
    assert "PARITY_TOKENS: tiny has 5 characters; use at least 32" in log
    assert SHORT not in log
    with guarded.server.client(SHORT) as api:
        assert api.get("/runs").status_code == 200


# -- 4. bytes everywhere -------------------------------------------------------------------------------------
@pytest.mark.parametrize("token", ["sécret", "🔑" * 8, "x" * 10_000, RW + "é"])
def test_non_ascii_or_huge_tokens_are_401(guarded: Guarded, browser: Browser, token: str) -> None:
    resp = browser.sign_in(token)
    assert resp.status_code == 401 and "Unknown token" in resp.text
    raw = ("Bearer " + token).encode("utf-8")
    resp = httpx.get(f"{guarded.server.url}/api/v1/runs",
                     headers={b"Authorization": raw, b"X-Forwarded-For": address().encode()})  # fmt: skip
    assert resp.status_code == 401, resp.text
    log = guarded.server.log()
    assert "Traceback" not in log and "internal error" not in log


# -- 5. headers and identity ---------------------------------------------------------------------------------
def test_every_authenticated_answer_is_no_store_and_nosniff(guarded: Guarded, browser: Browser) -> None:
    assert browser.sign_in(RO).status_code == 303
    cid = guarded.comparison
    bearer = {"Authorization": f"Bearer {RO}"}
    answers = [
        browser.get(f"/comparisons/{cid}/status.json"),
        browser.get(f"/comparisons/{cid}/download/summary.json"),
        browser.get(f"/comparisons/{cid}/calls.json"),
        browser.get(f"/runs/{guarded.run['id']}"),
        httpx.get(f"{guarded.server.url}/api/v1/runs", headers=bearer),
        httpx.get(f"{guarded.server.url}/api/v1/comparisons/{cid}", headers=bearer),
        httpx.get(f"{guarded.server.url}/api/v1/runs"),  # a 401 too
    ]
    for resp in answers:
        assert resp.status_code in (200, 401), (resp.url, resp.status_code)
        assert resp.headers["Cache-Control"] == "no-store", resp.url
        assert resp.headers["X-Content-Type-Options"] == "nosniff", resp.url
    docs = httpx.get(f"{guarded.server.url}/docs")
    assert "frame-ancestors 'none'" in docs.headers["Content-Security-Policy"]
    assert docs.headers["X-Frame-Options"] == "DENY"


def test_acceptances_record_who_signed_in_and_keep_author_as_text(guarded: Guarded, browser: Browser) -> None:
    project = guarded.run["project"]
    with guarded.server.client(RW2) as api:
        resp = api.post(f"/projects/{project}/acceptances",
                        json={"api": "Torch.a.0.forward", "note": "fine", "author": "alice"})  # fmt: skip
        assert resp.status_code == 201, resp.text
        assert (resp.json()["accepted_by"], resp.json()["author"]) == (fingerprint(RW2), "alice")

    assert browser.sign_in(RW).status_code == 303
    resp = browser.post(f"/comparisons/{guarded.comparison}/accept",
                        {"api": "Torch.b.0.forward", "note": "known", "author": "bob"})  # fmt: skip
    assert resp.status_code == 303, resp.text
    with guarded.server.client(RO) as api:
        found = {a["api"]: a for a in api.get(f"/projects/{project}/acceptances").json()["data"]}
    by_api = {api: (a["accepted_by"], a["author"]) for api, a in found.items()}
    assert by_api == {"Torch.a.0.forward": (fingerprint(RW2), "alice"), "Torch.b.0.forward": ("alice", "bob")}


def test_a_trusted_proxys_https_makes_cookies_secure(guarded: Guarded) -> None:
    b = other_browser(guarded)
    b.http.headers["X-Forwarded-Proto"] = "https"  # from 127.0.0.1, the guarded server's trusted proxy
    assert b.get("/login").status_code == 200
    assert "Secure" in b.cookie_header("parity_csrf")
    b.close()
