"""Write one rank directory in the msprobe layout (dump-format.md §3, §4): dump.json, stack.json,
construct.json, next to ``dump_tensor_data/``.

Pure Python (no torch): the client hands over plain dicts whose tensor leaves are already resolved. Each file
is written to a temporary name, fsynced and renamed, and the directory is fsynced after the step's files, so
a reader (or the uploader) never sees half a JSON file and a crash of the machine right after a step leaves
the step whole; each flush rewrites the whole file, as msprobe does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _encode_str
from pathlib import Path
from typing import Any

from parity.shared.dump.layout import CONSTRUCT_JSON, DUMP_JSON, STACK_JSON, TENSOR_DIR
from parity.shared.errors import DumpError

__all__ = ["RankDirWriter", "dump_document", "dumps_indent1", "fsync_dir", "stack_document"]



def dump_document(task: str, level: str, data: Mapping[str, Any], tensor_dir: Path | None) -> dict[str, Any]:
    """The top-level dump.json object, keys in msprobe's order (§4.1)."""
    return {
        "task": task,
        "level": level,
        "framework": "pytorch",
        "dump_data_dir": str(tensor_dir) if tensor_dir is not None else None,
        "data": data,
    }


def stack_document(stacks: Sequence[tuple[Sequence[str], Sequence[str]]]) -> dict[str, list[list[str]]]:
    """The deduplicated stack.json form: ``{"0": [[entry names], [frames, innermost first]], ...}``."""
    return {str(i): [list(names), list(frames)] for i, (names, frames) in enumerate(stacks)}


_INF = float("inf")


def _float(f: float) -> str:
    if f != f:
        return "NaN"
    if f == _INF:
        return "Infinity"
    if f == -_INF:
        return "-Infinity"
    return float.__repr__(f)


def _scalar(o: Any) -> str | None:
    """The JSON text of a scalar, or None for a container."""
    t = type(o)
    if t is str:
        return _encode_str(o)
    if t is float:
        return _float(o)
    if o is None:
        return "null"
    if o is True:
        return "true"
    if o is False:
        return "false"
    if t is int:
        return int.__repr__(o)
    if isinstance(o, str):
        return _encode_str(o)
    if isinstance(o, float):
        return _float(o)
    if isinstance(o, int):
        return int.__repr__(o)
    return None


def dumps_indent1(doc: Any) -> str:
    """Exactly ``json.dumps(doc, indent=1)`` (bare NaN/Infinity included), several times faster.

    The standard encoder falls back to its generator-based pure-Python path whenever ``indent`` is set;
    here scalars are formatted inline in the container loops and fragments are joined once at the end.
    """
    out: list[str] = []
    app = out.append

    def enc(o: Any, ind: int) -> None:
        if isinstance(o, dict):
            if not o:
                app("{}")
                return
            nl = "\n" + " " * (ind + 1)
            sep = "{" + nl
            for k, v in o.items():
                app(sep)
                sep = "," + nl
                app(_encode_str(k if isinstance(k, str) else str(k)))
                app(": ")
                text = _scalar(v)
                if text is None:
                    enc(v, ind + 1)
                else:
                    app(text)
            app("\n" + " " * ind + "}")
        elif isinstance(o, (list, tuple)):
            if not o:
                app("[]")
                return
            nl = "\n" + " " * (ind + 1)
            sep = "[" + nl
            for v in o:
                app(sep)
                sep = "," + nl
                text = _scalar(v)
                if text is None:
                    enc(v, ind + 1)
                else:
                    app(text)
            app("\n" + " " * ind + "]")
        else:
            text = _scalar(o)
            if text is None:
                raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
            app(text)

    enc(doc, 0)
    return "".join(out)


def _write_json(path: Path, doc: Any, before_replace: Callable[[], object] | None = None) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # One string, one write (json.dump would issue a write() per token); bare NaN/Infinity as msprobe.
        text = dumps_indent1(doc)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError) as exc:
        raise DumpError(path, f"cannot write: {exc}") from exc


def fsync_dir(directory: Path) -> None:
    """Make the entries (renames) of ``directory`` durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows, or a file system without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class RankDirWriter:
    """Owns ``{dump_path}/step{N}/rank{R}`` and rewrites its JSON files on every flush."""

    def __init__(self, rank_dir: Path) -> None:
        self.rank_dir = Path(rank_dir)
        self.tensor_dir = self.rank_dir / TENSOR_DIR

    def prepare(self, *, tensors: bool) -> None:
        """Create the directory (and ``dump_tensor_data/`` when tensors will be saved)."""
        try:
            self.rank_dir.mkdir(parents=True, exist_ok=True)
            if tensors:
                self.tensor_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise DumpError(self.rank_dir, f"cannot create the dump directory: {exc}") from exc

    def write(
        self,
        *,
        task: str,
        level: str,
        data: Mapping[str, Any],
        tensors: bool,
        stacks: Sequence[tuple[Sequence[str], Sequence[str]]] | None,
        construct: Mapping[str, str | None] | None,
        before_commit: Callable[[], object] | None = None,
    ) -> Path:
        """Write dump.json, and stack.json / construct.json when given (None = ``extra_info`` off).

        ``before_commit`` runs once dump.json is written under its temporary name, before it is renamed into
        place: what the files it names wait for (their sync) overlaps its encoding."""
        self.prepare(tensors=tensors)
        dump_json = self.rank_dir / DUMP_JSON
        doc = dump_document(task, level, data, self.tensor_dir.resolve() if tensors else None)
        _write_json(dump_json, doc, before_commit)
        if stacks is not None:
            _write_json(self.rank_dir / STACK_JSON, stack_document(stacks))
        if construct is not None:
            _write_json(self.rank_dir / CONSTRUCT_JSON, dict(construct))
        for directory in (self.tensor_dir, self.rank_dir) if tensors else (self.rank_dir,):
            fsync_dir(directory)  # the renames themselves survive a crash of the machine
        return dump_json
