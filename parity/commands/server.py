"""``parity server``: the Parity server under uvicorn, configured from ``PARITY_*`` environment variables."""

from __future__ import annotations

import argparse
import logging

#: Seconds a SIGTERM waits for requests in flight before the app shuts down (its workers stop first).
GRACEFUL_SHUTDOWN_S = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from parity.server.main import create_app
    from parity.server.settings import load_settings
    from parity.server.store import open_store

    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin otherwise
    settings = load_settings()  # an invalid setting (a token role typo) refuses to start, naming it
    # A wrong store URL is a one-line error here rather than a traceback from inside the app's startup.
    open_store(settings.resolved_store_url, settings.resolved_data_dir / "tmp")
    app = create_app(settings)
    # One process: the job pool lives in it, and uvicorn's --workers would start one pool per process.
    # On SIGTERM, requests still running after the grace are cut off (an uploader resumes its file) rather
    # than holding the shutdown open without bound.
    trusted = trusted_proxies(settings.forwarded_allow_ips)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, proxy_headers=trusted is not None,
                forwarded_allow_ips=trusted)  # fmt: skip
    return 0


def trusted_proxies(forwarded_allow_ips: str | None) -> str | None:
    """The proxies uvicorn is to believe (None: none, its proxy headers off). A reverse proxy's
    ``X-Forwarded-For`` (the address the wrong-token throttle counts) and ``X-Forwarded-Proto`` (https:
    Secure cookies) are believed only from those ``PARITY_FORWARDED_ALLOW_IPS`` names: uvicorn's own
    default trusts 127.0.0.1, so any process on the server's host could claim a new address per guess."""
    trusted = (forwarded_allow_ips or "").strip()
    return trusted or None
