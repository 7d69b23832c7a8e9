"""The REST contract's bodies, as the routes and services use them; the ORM models never leave the services.

The models live once, in :mod:`parity.shared.contract`, which the client parses its answers with too: add or
change a field there, never here. This module re-exports every name of the contract.
"""

from __future__ import annotations

from parity.shared.contract import *  # noqa: F403
from parity.shared.contract import __all__ as __all__
