"""Engines and sessions: SQLite in WAL mode with a busy timeout, or PostgreSQL through psycopg 3.

SQLite gets two engines on the same file: reads begin a deferred transaction, writes ``BEGIN IMMEDIATE``.
A deferred transaction that reads and then writes can fail at once with "database is locked" (the busy
timeout is not consulted when a snapshot must be upgraded); taking the write lock up front makes concurrent
writers queue on the busy timeout instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_engine(url: str, begin: str) -> Engine:
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # FULL: in WAL mode NORMAL may lose the last commits on a power loss, and a commit is what makes an
        # upload acknowledged (its bytes are fsynced before it); one fsync of the WAL per write transaction.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


def make_engines(url: str) -> tuple[Engine, Engine]:
    """(read engine, write engine) for ``url``; the same engine twice except on SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        return _sqlite_engine(url, "BEGIN"), _sqlite_engine(url, "BEGIN IMMEDIATE")
    engine = create_engine(url, pool_size=16, max_overflow=32, pool_pre_ping=True)
    return engine, engine


@dataclass
class Database:
    """The server's handle on its database; built by the app's lifespan and by each worker process."""

    read_engine: Engine
    write_engine: Engine

    def __post_init__(self) -> None:
        self._read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self.write_engine, expire_on_commit=False)

    @classmethod
    def connect(cls, url: str) -> Database:
        read_engine, write_engine = make_engines(url)
        return cls(read_engine, write_engine)

    @property
    def dialect(self) -> str:
        return self.read_engine.dialect.name

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read_sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose transaction commits on success and rolls back on error."""
        with self._write_sessions() as session, session.begin():
            yield session

    def checkpoint(self) -> None:
        """On SQLite, move the WAL into the database and truncate it, so the next transaction writes its
        WAL from the start (a delete in batches then needs the space of one batch, not of all); a no-op
        elsewhere, and where a reader holds the WAL (the next batch then waits for it)."""
        if self.dialect != "sqlite":
            return
        raw = self.write_engine.raw_connection()
        try:
            raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except Exception as exc:  # noqa: BLE001 - the driver's own error; the next write says what failed
            logger.warning("WAL checkpoint failed: %s", exc)
        finally:
            raw.close()

    def dispose(self) -> None:
        self.read_engine.dispose()
        if self.write_engine is not self.read_engine:
            self.write_engine.dispose()
