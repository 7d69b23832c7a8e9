"""Parity: precision comparison for PyTorch training.

``parity.client`` captures dumps inside training scripts, ``parity.shared`` holds the dump format and the
compare engine, ``parity.server`` stores runs and runs compare jobs. The client names are re-exported here
lazily, so ``import parity`` never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"
#: the msprobe release whose dump layout and compare report Parity matches (README, "Where Parity differs")
MSPROBE_COMPAT = "8.3.3"

# When Parity runs from a source checkout without being installed (``python -m parity`` in the repo root),
# the subpackages live beside this folder rather than inside it.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "shared" / "__init__.py").is_file() and str(_checkout) not in __path__:
    __path__.append(str(_checkout))

__all__ = ["PrecisionDebugger", "seed_all", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("PrecisionDebugger", "seed_all"):
        from parity import client

        return getattr(client, name)
    raise AttributeError(f"module 'parity' has no attribute {name!r}")
