"""Capture inside a training job, and upload: ``from parity.client import PrecisionDebugger, upload_dump``.

Each name is imported only when it is used: torch for the debugger, httpx and the REST contract for the
upload names, so ``parity.client.uploader`` stays usable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of this package that defines it
_HOMES = {
    "PrecisionDebugger": "debugger",
    "seed_all": "debugger",
    "ParityClient": "rest",
    "upload_dump": "upload",
    "BackgroundUploader": "uploader",
}

__all__ = ["BackgroundUploader", "ParityClient", "PrecisionDebugger", "seed_all", "upload_dump"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        return getattr(importlib.import_module(f"parity.client.{home}"), name)
    raise AttributeError(f"module 'parity.client' has no attribute {name!r}")
