"""The configured tokens, compared as bytes, and the server key that fingerprints them.

A token is never stored, logged or shown: sessions and acceptances refer to it by its *key*, an
HMAC-SHA256 of the token under the server key, and people see its name (``TOKEN:ROLE:NAME``) or the first
hex digits of that key. Without the server key neither lets anyone test a guess offline.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass

from parity.server.db import Database
from parity.server.models import ServerSecret
from parity.server.settings import MIN_TOKEN_LENGTH, TokenEntry
from sqlalchemy.exc import IntegrityError

logger = logging.getLogger(__name__)

#: A presented token longer than this is wrong without being hashed (no configured token is this long).
MAX_TOKEN_BYTES = 4096
#: Hex digits of a token's key shown as its fingerprint (48 bits: tells tokens apart, proves nothing).
FINGERPRINT_DIGITS = 12
SERVER_KEY_NAME = "session-key"
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


@dataclass(frozen=True)
class Token:
    """A configured token; ``key`` names it in sessions, ``identity`` to people."""

    secret: bytes
    can_write: bool
    name: str | None
    key: str

    @property
    def identity(self) -> str:
        return self.name or f"token {self.key[:FINGERPRINT_DIGITS]}"


class TokenRegistry:
    """The tokens of ``PARITY_TOKENS`` under one server key; empty when authentication is off."""

    def __init__(self, entries: list[TokenEntry], server_key: bytes) -> None:
        self.server_key = server_key
        secrets_ = [e.token.encode("ascii") for e in entries]
        self.tokens = [Token(secret, e.can_write, e.name, self.key_of(secret))
                       for secret, e in zip(secrets_, entries, strict=True)]  # fmt: skip
        self._by_key = {t.key: t for t in self.tokens}

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def key_of(self, secret: bytes) -> str:
        return hmac.new(self.server_key, b"token:" + secret, hashlib.sha256).hexdigest()

    def match(self, presented: bytes) -> Token | None:
        """The token equal to ``presented``; compared as bytes with ``compare_digest`` against every token
        (no early exit), so any byte string, non-ASCII or huge, is just a wrong token."""
        if not presented or len(presented) > MAX_TOKEN_BYTES:
            return None
        found = None
        for token in self.tokens:
            if hmac.compare_digest(token.secret, presented):
                found = token
        return found

    def by_key(self, key: str) -> Token | None:
        """The configured token a session refers to; None once it was removed from the settings."""
        return self._by_key.get(key)

    def warn_short(self) -> list[str]:
        """Log (and return) a warning for each token shorter than ``MIN_TOKEN_LENGTH``: the server still
        starts, since refusing would lock out a deployment at upgrade, but says which token to replace."""
        warnings = []
        for token in self.tokens:
            if len(token.secret) < MIN_TOKEN_LENGTH:
                warnings.append(
                    f"PARITY_TOKENS: {token.identity} has {len(token.secret)} characters; use at least "
                    f"{MIN_TOKEN_LENGTH} random ones ({MAKE_TOKEN})"
                )
        for line in warnings:
            logger.warning("%s", line)
        return warnings


def server_key(db: Database, configured: str | None) -> bytes:
    """``PARITY_SESSION_SECRET`` when set; else a random key made once and kept in the database, so that
    every process of the server and every restart fingerprints tokens alike (sessions survive restarts)."""
    if configured:
        return configured.encode()
    with db.read() as session:
        row = session.get(ServerSecret, SERVER_KEY_NAME)
        if row is not None:
            return bytes.fromhex(row.value)
    try:
        with db.write() as session:
            if session.get(ServerSecret, SERVER_KEY_NAME) is None:
                session.add(ServerSecret(name=SERVER_KEY_NAME, value=secrets.token_hex(32)))
    except IntegrityError:  # another process made it first: use theirs
        pass
    with db.read() as session:
        row = session.get(ServerSecret, SERVER_KEY_NAME)
        assert row is not None
        return bytes.fromhex(row.value)
