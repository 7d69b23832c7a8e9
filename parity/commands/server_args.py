"""The arguments every command that talks to a Parity server takes, and the client they make."""

from __future__ import annotations

import argparse
import os

from parity.client.rest import ParityClient


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--server`` and ``--token``, defaulting to ``$PARITY_SERVER`` and ``$PARITY_TOKEN``."""
    parser.add_argument("--server", default=os.environ.get("PARITY_SERVER"),
                        help="server base URL, e.g. http://127.0.0.1:8000 (default: $PARITY_SERVER)")
    parser.add_argument("--token", default=os.environ.get("PARITY_TOKEN"),
                        help="bearer token when the server requires one (default: $PARITY_TOKEN)")


def connect(args: argparse.Namespace) -> ParityClient:
    """The REST client of a command; a missing or malformed ``--server`` is a one-line error.

    The one seam of the commands' tests: they swap this for a client over the real app in process.
    """
    return ParityClient(args.server, token=args.token)
