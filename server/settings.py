"""Server settings, read from the environment (prefix ``PARITY_``) once per ``create_app`` call.

Nothing here is a module-level singleton: tests and worker processes build their own ``Settings`` so that a
process configured through its environment never sees another's configuration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from parity.shared.replay.sandbox import ReplayBudget

DEFAULT_MAX_UPLOAD_BYTES = 16 * 1024**3
#: every job has a deadline by default (issue 37): a held worker is never the queue's fate. A rank of a big
#: compare runs minutes, not hours; a validation parses dump.json files in seconds.
DEFAULT_JOB_TIMEOUT_S = 2 * 3600.0
DEFAULT_VALIDATION_TIMEOUT_S = 3600.0

#: ``PARITY_TOKENS`` roles: a token without one may write.
TOKEN_ROLES = {"rw": True, "ro": False}
#: Shorter tokens are accepted with a warning at start (README, "Tokens"): 32 random characters are out of
#: reach of any guessing the sign-in throttle lets through.
MIN_TOKEN_LENGTH = 32
_TOKEN_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,64}")


@dataclass(frozen=True)
class TokenEntry:
    """One ``TOKEN[:ROLE[:NAME]]`` entry of ``PARITY_TOKENS``."""

    token: str
    can_write: bool
    name: str | None = None


class Settings(BaseSettings):
    """Everything the server, its migrations and its workers need to know."""

    model_config = SettingsConfigDict(env_prefix="PARITY_", env_ignore_empty=True, extra="ignore")

    data_dir: Path = Field(default=Path("./parity-data"), description="SQLite database, blobs, temp files")
    database_url: str | None = Field(default=None, description="sqlite:///... or postgresql+psycopg://...")
    store_url: str | None = Field(default=None, description="file:///path or s3://bucket/prefix")
    workers: int = Field(default=2, ge=0, description="compare worker processes (0: jobs stay queued)")
    tokens: str | None = Field(
        default=None, description="comma-separated TOKEN, TOKEN:rw or TOKEN:ro entries (unset: no auth)"
    )
    max_upload_bytes: int = Field(default=DEFAULT_MAX_UPLOAD_BYTES, gt=0)
    # The caps of each tensor load in a compare (``shared.tensor_io.TensorLimits``): read here, handed down.
    max_tensor_file_bytes: int = Field(default=10 * 2**30, ge=0, description="largest tensor file compared")
    max_tensor_elements: int = Field(default=2**31, gt=0, description="largest tensor compared, in elements")
    job_backend: Literal["local", "celery"] = Field(
        default="local", description="local: a pool of processes in the server; celery: Celery workers"
    )
    celery_broker_url: str | None = Field(default=None, description="e.g. redis://localhost:6379/0")
    job_lease_seconds: float = Field(
        default=60.0, gt=0,
        description="how long a running job stays its worker's without a renewal (renewed every third of "
        "it); a job whose worker died is claimed again once its lease has passed",
    )  # fmt: skip
    job_timeout_seconds: float = Field(
        default=DEFAULT_JOB_TIMEOUT_S, gt=0,
        description="a rank of a compare (its replays included) still running after this many seconds "
        "fails with a message saying so, and its worker takes the next job",
    )  # fmt: skip
    validation_timeout_seconds: float = Field(
        default=DEFAULT_VALIDATION_TIMEOUT_S, gt=0,
        description="a run's validation still running after this many seconds leaves the run invalid, "
        "saying so (complete it again to retry), and its worker takes the next job",
    )  # fmt: skip
    replay_memory_bytes: int = Field(
        default=2 * 2**30, gt=0,
        description="address space the float64 replay's child process may take beyond the interpreter's "
        "and torch's own; a call that needs more is not replayed (over budget)",
    )  # fmt: skip
    replay_call_seconds: float = Field(
        default=60.0, gt=0, description="CPU seconds one call's replay may take (both sides) before it is "
        "stopped and not replayed (over budget)",
    )  # fmt: skip
    replay_seconds: float = Field(
        default=600.0, gt=0, description="CPU seconds all the replays of one rank's compare may take; the "
        "calls left when they are spent are not replayed (over budget)",
    )  # fmt: skip
    retention_days: float | None = Field(
        default=None, gt=0,
        description="runs created longer ago than this, and not marked keep, are deleted with their "
        "comparisons by the periodic sweep and by 'parity gc' (unset: runs are kept forever)",
    )  # fmt: skip
    sweep_interval_seconds: float = Field(
        default=3600.0, gt=0,
        description="how often the server removes orphaned blobs, stale temp files and expired runs",
    )  # fmt: skip
    temp_grace_seconds: float = Field(
        default=3600.0, ge=0,
        description="a temp file or an unrecorded blob untouched for this long is left over from a crash "
        "and is removed by the sweep (younger ones may belong to an upload in flight)",
    )  # fmt: skip
    worker_cache_bytes: int = Field(
        default=8 * 1024**3, gt=0,
        description="each worker's local copies of S3 blobs are kept under this many bytes (a rank pair's "
        "files must fit; files of finished work are evicted first); unused with a file store",
    )  # fmt: skip
    task_max_bytes: int = Field(
        default=2 * 1024**3, gt=0,
        description="a rank pair whose files (both runs' dump.json, stack.json and tensor files) pass this "
        "many bytes is compared as ceil(bytes / this) tasks, each taking a share of the rank's API calls",
    )  # fmt: skip
    reserve_bytes: int = Field(
        default=8 * 1024**2, ge=0,
        description="space the server keeps in a reserve file in the data folder and gives up when the "
        "disk is full, so that deletes can still write to the database",
    )  # fmt: skip

    @field_validator("tokens")
    @classmethod
    def _tokens_fail_closed(cls, value: str | None) -> str | None:
        # A typo must never turn authentication off or widen a token's rights: refuse to start instead.
        if value is None:
            return None
        parse_tokens(value)
        return value

    session_secret: str | None = Field(
        default=None, min_length=32,
        description="key that fingerprints tokens (sessions, acceptances, the pages); unset: a random key "
        "made once and kept in the database (set it to keep the key out of the database)",
    )  # fmt: skip
    session_hours: float = Field(default=12.0, gt=0, le=24 * 30, description="how long a web sign-in lasts")
    https_only: bool = Field(
        default=False,
        description="the server is reached over HTTPS only: cookies are always Secure, even when a proxy in "
        "front does not say the request came over HTTPS",
    )  # fmt: skip
    forwarded_allow_ips: str | None = Field(
        default=None,
        description="comma-separated addresses of the reverse proxies whose X-Forwarded-For/-Proto are "
        "trusted (uvicorn's forwarded_allow_ips); unset: none, every client is the address it connects "
        "from (the wrong-token throttle counts that)",
    )  # fmt: skip
    auth_failure_limit: int = Field(
        default=10, ge=1,
        description="wrong tokens from one client address within the window before its token attempts "
        "are answered 429 with Retry-After",
    )  # fmt: skip
    auth_failure_window_seconds: float = Field(
        default=600.0, gt=0, description="how long a wrong token counts against its address"
    )
    auth_failure_delay_seconds: float = Field(
        default=0.5, ge=0,
        description="each wrong token past the third in the window is answered this much later per "
        "failure before it (the fourth 1x, the fifth 2x, ...)",
    )  # fmt: skip

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

    def replay_budget(self) -> ReplayBudget:
        """What the float64 replays of one rank may spend, in the child process that runs them."""
        from parity.shared.replay.sandbox import ReplayBudget

        return ReplayBudget(self.replay_memory_bytes, self.replay_call_seconds, self.replay_seconds)

    def token_roles(self) -> dict[str, bool]:
        """token -> True when it may write; empty when authentication is off (``PARITY_TOKENS`` unset)."""
        return {e.token: e.can_write for e in self.token_entries()}

    def token_entries(self) -> list[TokenEntry]:
        """The tokens with their roles and names; empty when authentication is off."""
        return parse_token_entries(self.tokens) if self.tokens is not None else []


def parse_tokens(value: str) -> dict[str, bool]:
    """``PARITY_TOKENS`` as token -> may write (see ``parse_token_entries``)."""
    return {e.token: e.can_write for e in parse_token_entries(value)}


def parse_token_entries(value: str) -> list[TokenEntry]:
    """``PARITY_TOKENS`` (``TOKEN[:ROLE[:NAME]]``, comma-separated) as entries. Raises ``ValueError`` naming
    the entry for an unknown role, an empty token, a token that is not printable ASCII, a name that is not
    1-64 of ``A-Za-z0-9._@+-``, or a list with no token at all. The message never quotes a token."""
    entries: dict[str, TokenEntry] = {}
    for number, entry in enumerate(value.split(","), 1):
        entry = entry.strip()
        if not entry:
            continue
        token, sep, rest = entry.partition(":")
        role, has_name, name = rest.partition(":")
        token, role, name = token.strip(), role.strip().lower(), name.strip()
        where = f"PARITY_TOKENS entry {number}"
        if not token:
            raise ValueError(f"{where} ({entry!r}): empty token")
        if not (token.isascii() and token.isprintable()) or " " in token:
            raise ValueError(f"{where}: a token must be printable ASCII without spaces")
        if sep and role not in TOKEN_ROLES:
            raise ValueError(f"{where}: unknown role {role!r} (use {' or '.join(TOKEN_ROLES)})")
        if has_name and not _TOKEN_NAME.fullmatch(name):
            raise ValueError(f"{where}: name {name!r} must be 1-64 of A-Za-z0-9._@+-")
        entries[token] = TokenEntry(token, TOKEN_ROLES[role] if sep else True, name or None)
    if not entries:
        raise ValueError(f"PARITY_TOKENS={value!r} names no token; unset it to run without authentication")
    return list(entries.values())


def load_settings(**overrides: object) -> Settings:
    """``Settings`` from the environment (and ``overrides``); an invalid value is a :class:`ConfigError`
    naming the variable and the value, so ``parity server`` exits with one line instead of a traceback."""
    from parity.server.errors import ConfigError

    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(p) for p in error.get("loc", ())) or "settings"
            message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            name = f"PARITY_{field.upper()}"
            text = message if message.startswith(name) else f"{name}: {message} (got {error.get('input')!r})"
            problems.append(text)
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None
