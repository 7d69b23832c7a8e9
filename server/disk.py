"""Full disks: telling "no space left" apart from other failures, and a reserve that makes deletes possible.

A full disk must not look like a bug (a 500) nor lock the operator out: uploads and other writes answer 507
with a message that says the storage is full, reads keep working, and deletes free space. Deleting needs the
database to write (SQLite appends to its WAL first), which a full disk refuses; so the server keeps a small
reserve file in its data folder and gives it up the first time a delete meets a full disk. The reserve is
laid again once there is room (at start, and by each sweep).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["STORAGE_FULL_HINT", "Reserve", "is_storage_full"]

#: What a 507 tells the user to do.
STORAGE_FULL_HINT = "delete runs (DELETE /api/v1/runs/{id}) or ask the operator to add space"

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# SQLite's SQLITE_FULL and PostgreSQL's disk_full (SQLSTATE 53100) as their drivers word them.
_FULL_TEXTS = ("database or disk is full", "no space left on device", "disk quota exceeded")
_PG_DISK_FULL = "53100"


def is_storage_full(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it wraps) says the disk, a quota or the database is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if getattr(current, "sqlstate", None) == _PG_DISK_FULL:
            return True
        # Only a database driver's own error is read as text: a message quoting user input must not count.
        if type(current).__name__ == "OperationalError" and type(current).__module__.startswith("sqlite3"):
            if any(marker in str(current).lower() for marker in _FULL_TEXTS):
                return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


class Reserve:
    """``size`` bytes held in ``path`` on the data folder's filesystem, given up when the disk is full."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    def fill(self) -> bool:
        """Lay the reserve if it is missing and the disk has room for it twice over (so that laying it
        never fills the disk itself); True when it is in place."""
        if self.size <= 0:
            return False
        if self.path.exists():
            return True
        try:
            if shutil.disk_usage(self.path.parent).free < 2 * self.size:
                return False
            partial = self.path.with_name(self.path.name + ".partial")
            with open(partial, "wb") as fh:
                # Allocated, not sparse: a sparse file would free nothing when it is removed.
                os.posix_fallocate(fh.fileno(), 0, self.size)
                os.fsync(fh.fileno())
            os.replace(partial, self.path)
        except OSError as exc:
            logger.warning("could not lay the %d-byte disk reserve %s: %s", self.size, self.path, exc)
            self.path.with_name(self.path.name + ".partial").unlink(missing_ok=True)
            return False
        return True

    def release(self) -> bool:
        """Remove the reserve; True when there was one to give up (a retry may now succeed)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        logger.warning("storage is full: gave up the %d-byte reserve %s so that deletes can proceed",
                       self.size, self.path)  # fmt: skip
        return True
