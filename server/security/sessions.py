"""Web sessions kept in the database, so every process of the server sees a sign-out at once.

The browser's cookie holds 32 random bytes (URL-safe base64) and nothing else: no token, no hash of one. The
row is keyed by the SHA-256 of that id and says which token signed in (its key, ``security.tokens``), whether
the session may write, until when it lasts and when it was last used. Logging out deletes the row; signing
out everywhere deletes every row of the token; a row whose token is no longer configured is deleted when
the server starts and when it is next presented.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from parity.server.db import Database
from parity.server.models import WebSession, utcnow
from sqlalchemy import delete, update

#: ``last_seen_at`` is written at most this often per session (a page view is otherwise a read only).
TOUCH_INTERVAL = timedelta(seconds=60)
#: Cookie ids are ``token_urlsafe(32)``: 43 characters; anything else is not looked up.
SESSION_ID_LENGTH = 43


@dataclass(frozen=True)
class SessionInfo:
    token_key: str
    can_write: bool
    expires_at: datetime


def _row_id(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("ascii", "replace")).hexdigest()


class SessionStore:
    def __init__(self, db: Database, lifetime: timedelta) -> None:
        self.db = db
        self.lifetime = lifetime

    def create(self, token_key: str, can_write: bool) -> str:
        """A new session of the token; returns the id for the cookie. Expired rows are dropped here, so
        the table holds live sessions only."""
        session_id = secrets.token_urlsafe(32)
        now = utcnow()
        with self.db.write() as session:
            session.execute(delete(WebSession).where(WebSession.expires_at <= now))
            session.add(WebSession(
                id=_row_id(session_id), token_key=token_key, can_write=can_write, created_at=now,
                expires_at=now + self.lifetime, last_seen_at=now,
            ))  # fmt: skip
        return session_id

    def get(self, session_id: str) -> SessionInfo | None:
        """The live session behind a cookie id, its last use noted; None for an unknown or expired one."""
        if len(session_id) != SESSION_ID_LENGTH:
            return None
        row_id, now = _row_id(session_id), utcnow()
        with self.db.read() as session:
            row = session.get(WebSession, row_id)
            if row is None:
                return None
            info = SessionInfo(row.token_key, row.can_write, row.expires_at)
            last_seen = row.last_seen_at
        if info.expires_at <= now:
            self.end(session_id)
            return None
        if now - last_seen >= TOUCH_INTERVAL:
            with self.db.write() as session:
                session.execute(update(WebSession).where(WebSession.id == row_id).values(last_seen_at=now))
        return info

    def end(self, session_id: str) -> None:
        with self.db.write() as session:
            session.execute(delete(WebSession).where(WebSession.id == _row_id(session_id)))

    def end_all_of(self, token_key: str) -> int:
        """Sign the token out everywhere; returns how many sessions ended."""
        with self.db.write() as session:
            return int(session.execute(delete(WebSession).where(WebSession.token_key == token_key)).rowcount)

    def keep_only(self, token_keys: set[str]) -> int:
        """End every session whose token is not among ``token_keys`` (the configured ones) or that expired;
        returns how many ended."""
        with self.db.write() as session:
            gone = delete(WebSession).where(
                WebSession.token_key.not_in(token_keys) | (WebSession.expires_at <= utcnow())
            )
            return int(session.execute(gone).rowcount)
