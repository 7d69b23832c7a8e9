"""Upload paths: relative to the dump root and never able to leave their run's folder."""

from __future__ import annotations

import re

from parity.server.errors import BadRequest
from parity.shared.dump.layout import parse_stored_path

MAX_PATH_LENGTH = 1024


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
    if problem:
        raise BadRequest(f"file path {path!r} {problem}")
    step_rank = parse_stored_path(path)
    return step_rank if step_rank is not None else (None, None)


def check_sha256(value: str | None) -> str:
    """The ``X-Content-SHA256`` header as 64 lower-case hex digits."""
    if value is None or not re.fullmatch(r"[0-9a-fA-F]{64}", value.strip()):
        raise BadRequest(f"header X-Content-SHA256: expected 64 hex digits, got {value!r}")
    return value.strip().lower()
