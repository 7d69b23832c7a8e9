"""Alembic, configured from code so ``parity db upgrade`` and the server's start work from any directory."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

logger = logging.getLogger(__name__)


def _migrations_dir() -> Path:
    """The one migration tree for SQLite and PostgreSQL: ``migrations/`` in the source tree, installed as
    ``parity.migrations`` (found through the import system, so a wheel install finds it too)."""
    spec = importlib.util.find_spec("parity.migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (creating an SQLite file's folder first)."""
    from parity.server.db import make_engines

    engine, _ = make_engines(url)
    try:
        with engine.begin() as conn:
            config = alembic_config(url)
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    finally:
        engine.dispose()
    logger.info("database at %s is at revision %s", _safe(url), revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _safe(url: str) -> str:
    """The URL without its password, for logs."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


__all__ = [
    "MIGRATIONS_DIR",
    "alembic_config",
    "current_revision",
    "head_revision",
    "upgrade",
]
