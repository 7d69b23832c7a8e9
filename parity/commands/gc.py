"""``parity gc``: remove orphaned blobs, stale temp files and (with ``PARITY_RETENTION_DAYS``) expired runs.

Safe beside a running server on the same data: it decides from the database, and leaves anything younger
than ``PARITY_TEMP_GRACE_SECONDS`` to the uploads and jobs that may still own it. The server runs the same
sweep every ``PARITY_SWEEP_INTERVAL_SECONDS``.
"""

from __future__ import annotations

import argparse
import logging
import sys

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
    data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    db = Database.connect(settings.resolved_database_url)
    try:
        store = open_store(settings.resolved_store_url, data_dir / "tmp")
        reserve = Reserve(data_dir / "reserve", settings.reserve_bytes)
        runs = RunService(db, store, settings.max_upload_bytes, reserve)
        retention = RetentionService(
            db, store, runs, ComparisonService(db, store, NullQueue()),
            retention_days=settings.retention_days, grace_seconds=settings.temp_grace_seconds,
            reserve=reserve,
        )  # fmt: skip
        report = retention.sweep(dry_run=args.dry_run)
    finally:
        db.dispose()
    verb = "would remove" if args.dry_run else "removed"
    out = sys.stdout
    for run_id in report.expired_runs:
        out.write(f"run {run_id}: older than {settings.retention_days:g} days\n")
    for key in report.orphan_blobs:
        out.write(f"orphaned blob {key}\n")
    out.write(f"parity gc: {verb} {report}\n")
    return 0
