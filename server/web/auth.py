"""Sign-in for the web pages: a signed, HttpOnly, SameSite=Strict session cookie, and CSRF tokens.

With ``PARITY_TOKENS`` set, a person signs in once with a token; the cookie then carries a digest of that
token (never the token), the expiry and an HMAC-SHA256 signature under the server's session key. Each
request re-checks the digest against the configured tokens, so removing a token from ``PARITY_TOKENS`` (and
restarting) signs its sessions out, and a read-only token's sessions stay read-only.

Form posts carry a CSRF token that must equal the ``parity_csrf`` cookie (double submit; the cookie is
HttpOnly and SameSite=Strict, so another site can neither read it nor make the browser send it), and a
request whose ``Origin`` names another site is refused outright.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request, Response
from parity.server.errors import Forbidden

SESSION_COOKIE = "parity_session"
CSRF_COOKIE = "parity_csrf"


class LoginRequired(Exception):
    """A page was asked for without a valid session while sign-in is on: the handler redirects."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class WebUser:
    can_write: bool
    csrf: str
    auth_on: bool
    who: str  # "token 1a2b3c4d" (a digest prefix) or "anonymous"


class SessionSigner:
    def __init__(self, key: bytes, lifetime_s: float) -> None:
        self.key = key
        self.lifetime_s = lifetime_s

    def _mac(self, payload: bytes) -> str:
        mac = hmac.new(self.key, payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def sign(self, digest: str, now: float | None = None) -> str:
        body = json.dumps({"d": digest, "e": int((now or time.time()) + self.lifetime_s)}).encode()
        payload = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{payload}.{self._mac(payload.encode())}"

    def verify(self, cookie: str, now: float | None = None) -> str | None:
        """The token digest in a valid, unexpired cookie; None for anything else."""
        payload, _, mac = cookie.partition(".")
        if not payload or not hmac.compare_digest(mac, self._mac(payload.encode())):
            return None
        try:
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            digest, expiry = str(body["d"]), float(body["e"])
        except (ValueError, KeyError, TypeError):
            return None
        return digest if expiry > (now or time.time()) else None


def csrf_token(request: Request) -> str:
    """The browser's CSRF token (a new one when it has none; ``set_csrf_cookie`` then hands it out)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    return token if len(token) == 43 else secrets.token_urlsafe(32)


def set_csrf_cookie(request: Request, response: Response, token: str) -> None:
    if request.cookies.get(CSRF_COOKIE) != token:
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")  # fmt: skip


def current_user(request: Request) -> WebUser:
    """The person behind a page request; raises ``LoginRequired`` when sign-in is on and they are not."""
    roles: dict[str, bool] = request.app.state.token_roles
    csrf = csrf_token(request)
    if not roles:
        return WebUser(can_write=True, csrf=csrf, auth_on=False, who="anonymous")
    signer: SessionSigner = request.app.state.session_signer
    digest = signer.verify(request.cookies.get(SESSION_COOKIE, ""))
    if digest is not None:
        for token, can_write in roles.items():
            if hmac.compare_digest(token_digest(token), digest):
                return WebUser(can_write=can_write, csrf=csrf, auth_on=True, who=f"token {digest[:8]}")
    raise LoginRequired()


def token_role(request: Request, token: str) -> bool | None:
    """Whether ``token`` may write; None when it is not a configured token."""
    roles: dict[str, bool] = request.app.state.token_roles
    return next((w for known, w in roles.items() if hmac.compare_digest(known, token)), None)


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
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not hmac.compare_digest(cookie, form.get("csrf", "")):
        raise Forbidden("form post without a valid CSRF token refused; reload the page and try again")


def require_writer(user: WebUser, what: str) -> None:
    if not user.can_write:
        raise Forbidden(f"a read-only token cannot {what}")
