"""The server URL and token a user gives, checked and put in the one form the client sends.

Both come from a config.json field, a constructor argument, a ``--server``/``--token`` option or the
``PARITY_SERVER``/``PARITY_TOKEN`` environment, and a slip in either used to surface only at the end of
training (a 404 on ``/api/v1/api/v1/runs``, a 401). :func:`base_url` and :func:`clean_token` say what is wrong
at once, as a ``ValueError`` whose message the caller prefixes with the field or option.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from parity.shared.contract import API_PREFIX

__all__ = ["base_url", "clean_token"]

log = logging.getLogger(__name__)


def base_url(text: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing ``/`` or ``/api/v1`` (the client adds it)."""
    url = text.strip()
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{text!r}: expected an http:// or https:// URL such as http://host:8000")
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{text!r}: no host name (expected http://host:8000)")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r}: a server URL holds no '?' or '#' part (expected http://host:8000)")
    try:
        parts.port  # noqa: B018 - read for its check: a port outside 0-65535 or not a number raises
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number from 0 to 65535") from None
    url = url.rstrip("/")
    if url.endswith(API_PREFIX):  # the API's own address given for the server's: the client adds it itself
        log.debug("server URL %s: %s removed, the client adds it to each request", url, API_PREFIX)
        url = url[: -len(API_PREFIX)].rstrip("/")
    return url


def clean_token(token: str) -> str:
    """The bearer token without surrounding spaces (a token read from a file ends in a newline). A token
    that cannot travel in an HTTP header is refused, without ever quoting it (it is a secret)."""
    value = token.strip()
    if not value:
        raise ValueError("empty token")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"the token ({len(value)} characters) holds a space or a control character")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        problem = f"the token ({len(value)} characters) holds a character an HTTP header cannot carry"
        raise ValueError(problem) from None
    return value
