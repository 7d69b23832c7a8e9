"""``parity db upgrade``: run the migrations on ``PARITY_DATABASE_URL`` (the server also does so at start)."""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION")
    sub.required = True
    up = sub.add_parser("upgrade", help="migrate the database to the newest (or the given) revision")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    up.add_argument("--database-url", help="override PARITY_DATABASE_URL")
    cur = sub.add_parser("current", help="print the database's revision")
    cur.add_argument("--database-url", help="override PARITY_DATABASE_URL")


def run(args: argparse.Namespace) -> int:
    import sys

    # Before alembic is imported: it logs one INFO line per built-in plugin as it loads.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

    from parity.server.migrate import current_revision, upgrade
    from parity.server.settings import load_settings

    settings = load_settings(database_url=args.database_url) if args.database_url else load_settings()
    url = settings.resolved_database_url
    if args.db_command == "upgrade":
        settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(url, args.revision)
        return 0
    from parity.server.db import make_engines

    engine, _ = make_engines(url)
    try:
        sys.stdout.write(f"{current_revision(engine) or 'empty'}\n")
    finally:
        engine.dispose()
    return 0
