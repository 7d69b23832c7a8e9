"""Report writers: the compare table as xlsx, the advisor text file and the JSON summary.

Every writer publishes atomically: it writes to a hidden temporary name in the destination folder and renames
it over the final name, so a reader (a user, the server's download route) never sees half a report, and a
failed write leaves whatever was there before untouched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from parity.shared.errors import ReportError


@contextlib.contextmanager
def publish_atomically(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``, on failure remove it.

    The temporary file lives in the same folder so the final ``os.replace`` is a rename on one file system
    (atomic on POSIX), and it replaces a same-named report from an earlier run, as msprobe does. The temporary
    name keeps the final extension because some writers pick the file format from it.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_temp(path)
    except OSError as exc:
        raise ReportError(f"{path}: cannot create the report file: {exc.strerror or exc}") from exc
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{path}: cannot write the report file: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_temp(path: Path) -> Path:
    """A new empty file beside ``path`` with the mode a plain ``open`` gives (0666 less the umask), not
    ``mkstemp``'s 0600: a report is as readable as every other file its folder gets."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`publish_atomically`."""
    with publish_atomically(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
