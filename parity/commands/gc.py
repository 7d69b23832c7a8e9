"""``parity gc``: remove orphaned blobs, stale temp files and (with ``PARITY_RETENTION_DAYS``) expired runs.

Safe beside a running server on the same data: it decides from the database, and leaves anything younger
than ``PARITY_TEMP_GRACE_SECONDS`` to the uploads and jobs that may still own it. The server runs the same
sweep every ``PARITY_SWEEP_INTERVAL_SECONDS``. ``--dry-run`` writes nothing: it neither creates the data
folder nor migrates the database, says where it looked, and reports nothing to remove where there is no data.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parity.server.db import Database

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    parser.add_argument(
        "--retention-days", type=float, metavar="DAYS",
        help="delete runs older than DAYS that are not marked keep (default: PARITY_RETENTION_DAYS; unset: "
        "no run is deleted)",
    )  # fmt: skip
    parser.add_argument(
        "--grace-seconds", type=float, metavar="S",
        help="leave alone what is younger than S seconds (default: PARITY_TEMP_GRACE_SECONDS, 3600)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

    from parity.server.db import Database
    from parity.server.disk import Reserve
    from parity.server.jobs.base import NullQueue
    from parity.server.migrate import upgrade
    from parity.server.services.comparisons import ComparisonService
    from parity.server.services.retention import RetentionService
    from parity.server.services.runs import RunService
    from parity.server.settings import load_settings
    from parity.server.store import open_store

    overrides: dict[str, object] = {}
    if args.retention_days is not None:
        overrides["retention_days"] = args.retention_days
    if args.grace_seconds is not None:
        overrides["temp_grace_seconds"] = args.grace_seconds
    settings = load_settings(**overrides)
    data_dir = settings.resolved_data_dir
    database_url, store_url = settings.resolved_database_url, settings.resolved_store_url
    if args.dry_run:
        sys.stdout.write(f"parity gc: dry run, nothing is written; looking at the database "
                         f"{_safe(database_url)} and the store {store_url}\n")  # fmt: skip
        missing = _missing(database_url, store_url)
        if missing:
            sys.stdout.write(f"parity gc: {missing}: nothing to remove\n")
            return 0
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(database_url)
    db = Database.connect(database_url)
    with contextlib.ExitStack() as stack:
        stack.callback(db.dispose)
        if args.dry_run:
            _check_revision(db, database_url)
        # an S3 store's staging folder: a dry run stages nothing, so it gets one that is removed after
        staging = stack.enter_context(tempfile.TemporaryDirectory()) if args.dry_run else data_dir / "tmp"
        store = open_store(store_url, Path(staging))
        reserve = Reserve(data_dir / "reserve", settings.reserve_bytes)
        runs = RunService(db, store, settings.max_upload_bytes, reserve)
        retention = RetentionService(
            db, store, runs, ComparisonService(db, store, NullQueue()),
            retention_days=settings.retention_days, grace_seconds=settings.temp_grace_seconds,
            reserve=reserve,
        )  # fmt: skip
        report = retention.sweep(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    out = sys.stdout
    for run_id in report.expired_runs:
        out.write(f"run {run_id}: older than {settings.retention_days:g} days\n")
    for key in report.orphan_blobs:
        out.write(f"orphaned blob {key}\n")
    out.write(f"parity gc: {verb} {report}\n")
    return 0


def _safe(url: str) -> str:
    """The database URL without its password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _missing(database_url: str, store_url: str) -> str | None:
    """What a dry run finds missing (an SQLite file, a store folder), so that it reads nothing and creates
    nothing: opening either would make it."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        if not Path(url.database).is_file():
            return f"no database at {url.database}"
    if store_url.startswith("file:"):
        from urllib.parse import unquote, urlparse

        parsed = urlparse(store_url)
        host = parsed.netloc if parsed.netloc not in ("", "localhost") else ""
        root = Path(unquote(host + parsed.path))
        if not root.is_dir():
            return f"no store folder at {root}"
    return None


def _check_revision(db: Database, database_url: str) -> None:
    """A dry run does not migrate: a database behind the code is said, not upgraded."""
    from parity.server.errors import ServiceError
    from parity.server.migrate import current_revision, head_revision

    current, head = current_revision(db.read_engine), head_revision()
    if current != head:
        raise ServiceError(f"the database {_safe(database_url)} is at revision {current}, the code at "
                           f"{head}: a dry run migrates nothing (run `parity db upgrade`, or gc without "
                           "--dry-run)")  # fmt: skip
