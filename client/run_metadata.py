"""The environment a run was captured in, recorded with the run so that two runs can be told apart later.

Everything here is best effort: a missing torch, no git, or an odd accelerator must never stop an upload, so
each probe falls back to ``None`` (or ``"cpu"``) instead of raising.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "ENVIRONMENT_FILE",
    "capture_metadata",
    "detect_device",
    "git_commit",
    "installed_packages",
    "read_environment",
    "selected_environment",
    "write_environment",
]

#: The run's environment, written by the training client at the dump root, beside the ``step*`` folders:
#: msprobe is pointed at a step or rank folder and never lists the root, and Parity's own readers take only
#: ``step*/rank*``. ``parity upload`` sends it as the run's metadata, as the client's own upload does.
ENVIRONMENT_FILE = "parity_environment.json"
#: Larger is not an environment file (the package list of a big image is ~50 KB).
MAX_ENVIRONMENT_BYTES = 8 << 20

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
        try:
            meta["cudnn_version"] = torch.backends.cudnn.version()
        except Exception:
            log.debug("cudnn version probe failed", exc_info=True)
    if device == "npu":
        meta["torch_npu_version"] = _version_of("torch_npu")
    meta["driver_version"] = driver_version(device)
    meta["packages"] = installed_packages()
    meta["env"] = selected_environment()
    return meta


#: Environment variables that change numerics or communication; recorded so two runs can be told apart.
ENV_PREFIXES = (
    "CUDA_", "CUBLAS", "CUDNN_", "NCCL_", "HCCL_", "ASCEND_", "TORCH_", "PYTORCH_", "NVIDIA_TF32", "OMP_",
    "MKL_", "OPENBLAS_", "XLA_", "HIP_", "ROCM_", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
)  # fmt: skip
#: Never recorded, whatever the prefix: the run's metadata is shared with the whole team.
SECRET_WORDS = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)


def selected_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The numerics-relevant environment variables (``ENV_PREFIXES``), never one that looks like a secret."""
    environ = dict(os.environ if environ is None else environ)
    return {
        name: value[:512]
        for name, value in sorted(environ.items())
        if name.startswith(ENV_PREFIXES) and not SECRET_WORDS.search(name)
    }


def installed_packages() -> dict[str, str]:
    """``name -> version`` of every installed distribution (what ``pip freeze`` would list)."""
    from importlib import metadata

    packages: dict[str, str] = {}
    try:
        for dist in metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                packages[name.lower()] = dist.version
    except Exception:
        log.debug("package listing failed", exc_info=True)
    return dict(sorted(packages.items()))


def _version_of(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def driver_version(device: str) -> str | None:
    """The accelerator driver's version: NVIDIA's kernel module, or Ascend's ``version.info``."""
    sources = {
        "gpu": ("/proc/driver/nvidia/version", r"Kernel Module\s+([\w.\-]+)"),
        "npu": ("/usr/local/Ascend/driver/version.info", r"Version=([\w.\-]+)"),
    }
    if device not in sources:
        return None
    path, pattern = sources[device]
    try:
        match = re.search(pattern, Path(path).read_text(errors="replace"))
    except OSError:
        return None
    return match.group(1) if match else None


def write_environment(dump_root: Path, device: str | None = None) -> Path | None:
    """Write :data:`ENVIRONMENT_FILE` at ``dump_root`` (atomically: every rank may write it); best effort:
    a failure is one warning, never an error, since the dump itself matters more."""
    device = device or detect_device()
    document = {"device": device, "metadata": capture_metadata(device, cwd=Path.cwd())}
    path = dump_root / ENVIRONMENT_FILE
    partial = dump_root / f".{ENVIRONMENT_FILE}.{os.getpid()}.partial"
    try:
        dump_root.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(document, indent=1, default=str), encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        log.warning("parity: could not write the run's environment to %s: %s", path, exc)
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return None
    return path


def read_environment(dump_dir: Path) -> tuple[str | None, dict[str, Any]]:
    """The device and metadata in the :data:`ENVIRONMENT_FILE` of ``dump_dir``, a dump root, a step or a rank
    folder (the file is looked for there and up to two folders above); ``(None, {})`` without one. A file that
    is not one is skipped with a warning naming it: the dump can be uploaded without its environment."""
    for folder in (dump_dir, dump_dir.parent, dump_dir.parent.parent):
        path = folder / ENVIRONMENT_FILE
        if path.is_file():
            break
    else:
        return None, {}
    try:
        if path.stat().st_size > MAX_ENVIRONMENT_BYTES:
            raise ValueError(f"over {MAX_ENVIRONMENT_BYTES >> 20} MiB")
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
            raise ValueError('expected an object with a "metadata" object')
        device = document.get("device")
        return (device if isinstance(device, str) else None), document["metadata"]
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        log.warning("%s: not a run environment (%s); uploaded without it", path, exc)
        return None, {}
