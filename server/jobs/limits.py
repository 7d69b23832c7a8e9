"""What bounds a compare job and what it may tell its readers, apart from how jobs are claimed and run.

* :class:`Deadline`: ``PARITY_JOB_TIMEOUT_SECONDS`` as a point in time the runner checks between units of
  work, and its lease thread watches, so a job is failed at its deadline even inside one long unit.
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
    """The job ran past ``PARITY_JOB_TIMEOUT_SECONDS``."""


class Deadline:
    """``timeout`` seconds from now, or never (None)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = time.monotonic() + timeout if timeout is not None else None

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() > self.at

    def cap(self, pause: float) -> float:
        """``pause``, shortened so that a sleep of it wakes by the deadline."""
        return pause if self.at is None else max(0.0, min(pause, self.at - time.monotonic()))

    def message(self) -> str:
        return (f"comparison ran longer than PARITY_JOB_TIMEOUT_SECONDS={self.timeout:g} s and was stopped; "
                "compare fewer ranks or steps, or ask the operator to raise the limit")  # fmt: skip

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
