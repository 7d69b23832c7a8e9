"""Upload paths: relative to the dump root and never able to leave their run's folder."""

from __future__ import annotations

import re

from parity.server.errors import BadRequest
from parity.shared.dump.layout import parse_stored_path

MAX_PATH_LENGTH = 1024
SHA256_PATTERN = r"^\s*[0-9a-fA-F]{64}\s*$"
#: Steps and ranks are stored as 32-bit integers; nine digits keep every accepted number in range.
MAX_INDEX_DIGITS = 9


def check_upload_path(path: str) -> tuple[int | None, int | None]:
    """Refuse any path that could escape the run (``..``, absolute, NUL, backslash, empty segment, drive
    letters, control characters); returns the (step, rank) of a ``stepN/rankR/...`` path."""
    problem = None
    if not path:
        problem = "is empty"
    elif len(path) > MAX_PATH_LENGTH:
        problem = f"is longer than {MAX_PATH_LENGTH} characters"
    elif "\x00" in path:
        problem = "contains a NUL byte"
    elif "\\" in path:
        problem = "contains a backslash"
    elif path.startswith("/"):
        problem = "is absolute"
    elif any(ord(c) < 32 for c in path):
        problem = "contains a control character"
    else:
        parts = path.split("/")
        if any(p == "" for p in parts):
            problem = "has an empty segment"
        elif any(p in (".", "..") for p in parts):
            problem = "has a '.' or '..' segment"
        elif ":" in parts[0]:
            problem = "starts with a drive or scheme"
    if problem is None:
        problem = _index_problem(path)
    if problem:
        raise BadRequest(f"file path {path!r} {problem}")
    step_rank = parse_stored_path(path)
    return step_rank if step_rank is not None else (None, None)


def _index_problem(path: str) -> str | None:
    """Why a ``stepN`` first folder (or the ``rankR`` folder under it) is not written the one way it can be,
    or None: a folder of ``step`` followed by digits of any script must be ``step`` followed by ASCII digits
    without leading zeros, so that no two paths name the same step."""
    parts = path.split("/")[:-1]  # folders only
    for position, kind in enumerate(("step", "rank")):
        if position >= len(parts):
            return None
        folder = parts[position]
        digits = folder[len(kind) :] if folder.startswith(kind) else ""
        if not digits.isdigit():  # not an index folder at all (Unicode digits count, to be refused below)
            return None
        if not digits.isascii():
            return f"has folder {folder!r}: write the {kind} in ASCII digits ({kind}{int(digits)})"
        if len(digits) > 1 and digits.startswith("0"):
            return f"has folder {folder!r}: write {kind}{int(digits)} (no leading zeros)"
        if len(digits) > MAX_INDEX_DIGITS:
            return f"has folder {folder!r}: a {kind} number has at most {MAX_INDEX_DIGITS} digits"
    return None


def check_sha256(value: str | None) -> str:
    """The ``X-Content-SHA256`` header as 64 lower-case hex digits."""
    if value is None or not re.fullmatch(SHA256_PATTERN, value):
        raise BadRequest(f"header X-Content-SHA256: expected 64 hex digits, got {value!r}")
    return value.strip().lower()
