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

__all__ = ["DEFAULT_PORT", "base_url", "clean_token", "unreachable_hint", "with_default_port"]

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


#: The port ``parity server`` listens on unless told another.
DEFAULT_PORT = 8000


def with_default_port(url: str) -> str | None:
    """``url`` with ``parity server``'s port when it names none (``http://host`` -> ``http://host:8000``),
    else None: without a port an http URL means port 80, where a Parity server rarely listens."""
    parts = urlsplit(url)
    if parts.port is not None or not parts.hostname:
        return None
    return parts._replace(netloc=f"{parts.netloc}:{DEFAULT_PORT}").geturl()


def unreachable_hint(url: str) -> str:
    """What to say after "server unreachable" for ``url``: the port it tried when it names none."""
    guess = with_default_port(url)
    if guess is None:
        return ""
    default = 443 if url.startswith("https://") else 80
    return (f" (the URL names no port, so port {default} was tried; parity server listens on "
            f"{DEFAULT_PORT} unless told otherwise: {guess}?)")


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
