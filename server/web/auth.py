"""Sign-in for the web pages: a server-side session behind a random, HttpOnly, SameSite=Strict cookie, and
CSRF tokens.

With ``PARITY_TOKENS`` set, a person signs in once with a token (checked as the REST API checks it: bytes,
throttled per address, ``api/deps.check_token``). The cookie then holds a random session id and nothing else;
the session lives in the database (``security.sessions``), so signing out ends it for good, "sign out
everywhere" ends every session of the token, and a token removed from ``PARITY_TOKENS`` ends its sessions.
Each request re-reads the token's role, so a read-only token's sessions stay read-only. What the page shows
of a token is its name or an HMAC fingerprint under the server key, which lets no one test a guess.

Form posts carry a CSRF token that must equal the ``parity_csrf`` cookie (double submit; the cookie is
HttpOnly and SameSite=Strict, so another site can neither read it nor make the browser send it), and a
request whose ``Origin`` names another site is refused outright. Signing in and out hands out a new one.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request, Response
from parity.server.errors import Forbidden
from parity.server.security.sessions import SessionStore
from parity.server.security.tokens import TokenRegistry

SESSION_COOKIE = "parity_session"
CSRF_COOKIE = "parity_csrf"
CSRF_LENGTH = 43  # secrets.token_urlsafe(32)


class LoginRequired(Exception):
    """A page was asked for without a valid session while sign-in is on: the handler redirects."""


@dataclass(frozen=True)
class WebUser:
    can_write: bool
    csrf: str
    auth_on: bool
    who: str  # a token's name, "token " + its keyed fingerprint, or "anonymous"


def cookie_attributes(request: Request) -> dict[str, Any]:
    """The attributes every cookie of ours is set with, and deleted with: a browser keeps a cookie that a
    delete with other attributes (path, Secure) does not match."""
    https_only = bool(getattr(request.app.state.settings, "https_only", False))
    return {"path": "/", "httponly": True, "samesite": "strict",
            "secure": https_only or request.url.scheme == "https"}  # fmt: skip


def csrf_token(request: Request) -> str:
    """The browser's CSRF token (a new one when it has none; ``set_csrf_cookie`` then hands it out)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    return token if len(token) == CSRF_LENGTH else secrets.token_urlsafe(32)


def set_csrf_cookie(request: Request, response: Response, token: str) -> None:
    if request.cookies.get(CSRF_COOKIE) != token:
        response.set_cookie(CSRF_COOKIE, token, **cookie_attributes(request))


def start_session(request: Request, response: Response, session_id: str) -> None:
    """The cookie of a new session, and a new CSRF token: nothing from before sign-in carries over."""
    sessions: SessionStore = request.app.state.sessions
    response.set_cookie(SESSION_COOKIE, session_id, max_age=int(sessions.lifetime.total_seconds()),
                        **cookie_attributes(request))  # fmt: skip
    response.set_cookie(CSRF_COOKIE, secrets.token_urlsafe(32), **cookie_attributes(request))


def clear_session(request: Request, response: Response) -> None:
    """Delete the session cookie with the attributes it was set with, and hand out a new CSRF token."""
    response.delete_cookie(SESSION_COOKIE, **cookie_attributes(request))
    response.set_cookie(CSRF_COOKIE, secrets.token_urlsafe(32), **cookie_attributes(request))


def current_user(request: Request) -> WebUser:
    """The person behind a page request; raises ``LoginRequired`` when sign-in is on and they are not.
    A plain function: FastAPI runs it in the threadpool, where the session's database read may block."""
    tokens: TokenRegistry = request.app.state.tokens
    csrf = csrf_token(request)
    if not tokens.enabled:
        return WebUser(can_write=True, csrf=csrf, auth_on=False, who="anonymous")
    sessions: SessionStore = request.app.state.sessions
    session_id = request.cookies.get(SESSION_COOKIE, "")
    info = sessions.get(session_id) if session_id else None
    if info is None:
        raise LoginRequired()
    token = tokens.by_key(info.token_key)
    if token is None:  # removed from PARITY_TOKENS (or the server key changed): the session ends here
        sessions.end(session_id)
        raise LoginRequired()
    return WebUser(can_write=info.can_write and token.can_write, csrf=csrf, auth_on=True, who=token.identity)


def check_form(request: Request, form: dict[str, str]) -> None:
    """Refuse a form post from another site: its Origin must be ours and its CSRF field the cookie's."""
    origin = request.headers.get("origin")
    if origin and origin != "null":
        ours = urlsplit(str(request.base_url))
        theirs = urlsplit(origin)
        if (theirs.scheme, theirs.netloc) != (ours.scheme, ours.netloc):
            raise Forbidden(f"form post from another origin ({origin}) refused")
    elif origin == "null":
        raise Forbidden("form post from an opaque origin refused")
    cookie = request.cookies.get(CSRF_COOKIE, "").encode("utf-8", "replace")
    sent = form.get("csrf", "").encode("utf-8", "replace")
    if not cookie or not hmac.compare_digest(cookie, sent):
        raise Forbidden("form post without a valid CSRF token refused; reload the page and try again")


def require_writer(user: WebUser, what: str) -> None:
    if not user.can_write:
        raise Forbidden(f"a read-only token cannot {what}")
