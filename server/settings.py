"""Server settings, read from the environment (prefix ``PARITY_``) once per ``create_app`` call.

Nothing here is a module-level singleton: tests and worker processes build their own ``Settings`` so that a
process configured through its environment never sees another's configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MAX_UPLOAD_BYTES = 16 * 1024**3


class Settings(BaseSettings):
    """Everything the server, its migrations and its workers need to know."""

    model_config = SettingsConfigDict(env_prefix="PARITY_", env_ignore_empty=True, extra="ignore")

    data_dir: Path = Field(default=Path("./parity-data"), description="SQLite database, blobs, temp files")
    database_url: str | None = Field(default=None, description="sqlite:///... or postgresql+psycopg://...")
    store_url: str | None = Field(default=None, description="file:///path or s3://bucket/prefix")
    workers: int = Field(default=2, ge=0, description="compare worker processes (0: jobs stay queued)")
    tokens: str | None = Field(default=None, description="comma-separated TOKEN or TOKEN:ro entries")
    max_upload_bytes: int = Field(default=DEFAULT_MAX_UPLOAD_BYTES, gt=0)
    job_backend: Literal["local", "celery"] = Field(
        default="local", description="local: a pool of processes in the server; celery: Celery workers"
    )
    celery_broker_url: str | None = Field(default=None, description="e.g. redis://localhost:6379/0")
    job_lease_seconds: float = Field(
        default=60.0, gt=0,
        description="how long a running job stays its worker's without a renewal (renewed every third of "
        "it); a job whose worker died is claimed again once its lease has passed",
    )  # fmt: skip

    session_secret: str | None = Field(
        default=None, min_length=32,
        description="key that signs the web pages' sign-in cookies; unset: a random key per server start "
        "(everyone signs in again after a restart)",
    )  # fmt: skip
    session_hours: float = Field(default=12.0, gt=0, le=24 * 30, description="how long a web sign-in lasts")

    @field_validator("database_url")
    @classmethod
    def _psycopg_driver(cls, value: str | None) -> str | None:
        # A bare postgresql:// URL would make SQLAlchemy look for psycopg2, which is not installed.
        if value and value.startswith(("postgresql://", "postgres://")):
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value

    @property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.resolved_data_dir / 'parity.db'}"

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or (self.resolved_data_dir / "blobs").as_uri()

    def token_roles(self) -> dict[str, bool]:
        """token -> True when it may write; empty when authentication is off."""
        roles: dict[str, bool] = {}
        for entry in (self.tokens or "").split(","):
            entry = entry.strip()
            if not entry:
                continue
            token, _, role = entry.partition(":")
            roles[token] = role.strip().lower() != "ro"
        return roles
