"""What bounds a compare job and what it may tell its readers, apart from how jobs are claimed and run.

* :class:`Deadline`: ``PARITY_JOB_TIMEOUT_SECONDS`` (a rank) or ``PARITY_VALIDATION_TIMEOUT_SECONDS`` (a
  run's validation) as a point in time the runner checks between units of work, and its lease thread
  watches, so a job is failed at its deadline even inside one long unit.
* :func:`redact_paths`: a job's error without the server's folders (readers of the API see the error; the
  log keeps the full text).

The element cap that bounds one unit lives with the tensor loaders (``parity.shared.tensor_io``).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from parity.server.errors import ServiceError
from parity.server.settings import Settings

__all__ = ["Deadline", "JobTimeout", "redact_paths"]


class JobTimeout(ServiceError):
    """The job ran past its deadline (``PARITY_JOB_TIMEOUT_SECONDS``, ``..._VALIDATION_TIMEOUT_SECONDS``)."""


#: what a job past its deadline says, by the kind of job: (the setting that set it, what to do)
_ADVICE = {
    "comparison": ("PARITY_JOB_TIMEOUT_SECONDS",
                   "compare fewer ranks or steps, or ask the operator to raise the limit"),
    "validation": ("PARITY_VALIDATION_TIMEOUT_SECONDS",
                   "complete the run again to retry, or ask the operator to raise the limit"),
}  # fmt: skip


class Deadline:
    """``timeout`` seconds from now, or never (None); ``kind``: the job's (``comparison``, ``validation``),
    for its message."""

    def __init__(self, timeout: float | None, kind: str = "comparison") -> None:
        self.timeout = timeout
        self.kind = kind
        self.at = time.monotonic() + timeout if timeout is not None else None

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() > self.at

    def cap(self, pause: float) -> float:
        """``pause``, shortened so that a sleep of it wakes by the deadline."""
        return pause if self.at is None else max(0.0, min(pause, self.at - time.monotonic()))

    def message(self) -> str:
        setting, advice = _ADVICE[self.kind]
        return f"{self.kind} ran longer than {setting}={self.timeout:g} s and was stopped; {advice}"

    def check(self) -> None:
        if self.passed():
            raise JobTimeout(self.message())


def redact_paths(message: str, settings: Settings) -> str:
    """``message`` without the server's own folders: every absolute path under the data folder, the blob
    store or the temp folder becomes ``<server path>/NAME`` (its last part, which is what a reader can act
    on); a job's staging paths mean nothing to a user and map the server's disk for an attacker."""
    roots = {str(settings.resolved_data_dir), tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
    store_url = settings.resolved_store_url
    if store_url.startswith("file://"):
        roots.add(str(Path(unquote(urlparse(store_url).path)).resolve()))
    pattern = "|".join(re.escape(root.rstrip("/")) for root in sorted(roots, key=len, reverse=True) if root)

    def replace(match: re.Match[str]) -> str:
        name = match.group(0).rstrip("/").rsplit("/", 1)[-1]
        return f"<server path>/{name}" if name else "<server path>"

    return re.sub(rf"(?:{pattern})(?:/[^\s'\":,;()\[\]]*)?", replace, message)
