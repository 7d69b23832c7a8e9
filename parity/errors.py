"""Which exceptions the command line reports as a one-line error rather than a traceback."""

from __future__ import annotations

import importlib


def user_error_types() -> tuple[type[BaseException], ...]:
    """The base error of each side that is importable here (the client and server may not be installed)."""
    found: list[type[BaseException]] = []
    for module_name, class_name in (
        ("parity.shared.errors", "ParityError"),
        ("parity.client.errors", "ClientError"),
        ("parity.server.errors", "ServiceError"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(getattr(module, class_name))
    return tuple(found)
