"""The environment a run was captured in, recorded with the run so that two runs can be told apart later.

Everything here is best effort: a missing torch, no git, or an odd accelerator must never stop an upload, so
each probe falls back to ``None`` (or ``"cpu"``) instead of raising.
"""

from __future__ import annotations

import logging
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["capture_metadata", "detect_device", "git_commit"]

log = logging.getLogger(__name__)


def _torch() -> Any:
    """torch if the training script has it (the uploader never makes it a hard dependency)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def detect_device() -> str:
    """The run's device as the server names it: ``npu`` (torch_npu present), ``gpu`` (CUDA), else ``cpu``."""
    torch = _torch()
    if torch is None:
        return "cpu"
    try:
        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            return "npu"
        if torch.cuda.is_available():
            return "gpu"
    except Exception:  # an accelerator runtime that cannot even answer is treated as absent
        log.debug("device probe failed", exc_info=True)
    return "cpu"


def _device_name(device: str) -> str | None:
    torch = _torch()
    try:
        if device == "gpu" and torch is not None:
            return str(torch.cuda.get_device_name(0))
        if device == "npu" and torch is not None:
            return str(torch.npu.get_device_name(0))
    except Exception:
        log.debug("device name probe failed", exc_info=True)
    return platform.processor() or platform.machine() or None


def git_commit(cwd: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` in ``cwd`` (the training script's directory), or None outside a repository."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def capture_metadata(device: str | None = None, *, cwd: Path | None = None) -> dict[str, Any]:
    """The metadata of ``POST /runs``: versions, device, host and git commit, with ``None`` where unknown."""
    from parity import __version__

    torch = _torch()
    device = device or detect_device()
    meta: dict[str, Any] = {
        "parity_version": __version__,
        "python": platform.python_version(),
        "torch_version": getattr(torch, "__version__", None) if torch is not None else None,
        "device_name": _device_name(device),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "git_commit": git_commit(cwd),
        "argv": list(sys.argv),
    }
    if torch is not None and device == "gpu":
        meta["cuda_version"] = getattr(torch.version, "cuda", None)
    return meta
