"""Capture inside a training job: ``from parity.client import PrecisionDebugger, seed_all``.

Torch is imported only when these names are used, so ``parity.client.uploader`` stays usable without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PrecisionDebugger", "seed_all"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from parity.client import debugger

        return getattr(debugger, name)
    raise AttributeError(f"module 'parity.client' has no attribute {name!r}")
