"""compare.json: what to compare, in msprobe v1's format (compare.md §1.1), parsed and checked up front.

Single rank::

    {"npu_path": "npu/step0/rank0/dump.json", "bench_path": "gpu/step0/rank0/dump.json",
     "stack_path": "npu/step0/rank0/stack.json", "is_print_compare_log": true}

Multi-rank: ``npu_path`` and ``bench_path`` are step directories (the parents of ``rank*``); ranks are paired
by number and each rank's stack.json is found next to its dump.json.

Choices (documented in the README):

* relative paths are taken relative to the current directory, as msprobe does;
* unknown keys are **warned about, not refused**: msprobe ignores them and compare.json files written for it
  may carry MindSpore-only keys (``rank_id``, ``common``); a key that looks like a misspelt known key names
  the key it probably meant;
* everything else that is wrong (missing file, wrong type, file vs directory mixed, a dump.json that is not
  called so) is a one-line :class:`CompareInputError` naming the key and the path, raised before any work.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from parity.shared.dump.layout import DUMP_JSON, find_rank_dirs
from parity.shared.dump.reader import read_json
from parity.shared.errors import CompareInputError

logger = logging.getLogger(__name__)

KNOWN_KEYS = ("npu_path", "bench_path", "stack_path", "is_print_compare_log")
#: msprobe keys that only mean something for MindSpore; accepted and ignored with a warning.
MINDSPORE_KEYS = ("rank_id", "common")


class SpecKind(str, Enum):
    """Whether compare.json names two dump.json files or two step directories."""

    SINGLE_RANK = "single-rank"
    MULTI_RANK = "multi-rank"


@dataclass(frozen=True, slots=True)
class CompareSpec:
    """A checked compare request: the two sides, the optional stack.json and the per-row log switch."""

    npu_path: Path
    bench_path: Path
    stack_path: Path | None = None
    is_print_compare_log: bool = True
    source: Path | None = None  # the compare.json it came from, for messages

    @property
    def kind(self) -> SpecKind:
        return SpecKind.MULTI_RANK if self.npu_path.is_dir() else SpecKind.SINGLE_RANK

    @property
    def multi_rank(self) -> bool:
        return self.kind is SpecKind.MULTI_RANK


def load_compare_spec(path: str | Path) -> CompareSpec:
    """Read and check a compare.json file (see the module docstring for the format)."""
    path = Path(path)
    if path.is_dir():
        raise CompareInputError(f"{path}: is a directory, expected a compare.json file")
    doc = read_json(path, "compare.json")  # DumpError with line and column when malformed
    return parse_compare_spec(doc, source=path)


def parse_compare_spec(doc: Any, *, source: str | Path | None = None) -> CompareSpec:
    """Check a compare.json document already parsed (the server passes its request body here)."""
    where = str(source) if source is not None else "compare.json"
    if not isinstance(doc, Mapping):
        raise CompareInputError(f"{where}: must be a JSON object with npu_path and bench_path")
    _warn_unknown_keys(doc, where)

    npu = _path_value(doc, "npu_path", where, required=True)
    bench = _path_value(doc, "bench_path", where, required=True)
    assert npu is not None and bench is not None
    stack = _path_value(doc, "stack_path", where, required=False)
    log_rows = doc.get("is_print_compare_log", True)
    if not isinstance(log_rows, bool):
        raise CompareInputError(f"{where}: 'is_print_compare_log' must be true or false, got {log_rows!r}")

    for key, value in (("npu_path", npu), ("bench_path", bench)):
        if not value.exists():
            raise CompareInputError(f"{where}: '{key}' {value} does not exist")
    if npu.is_dir() != bench.is_dir():
        file_key, file_path = ("npu_path", npu) if bench.is_dir() else ("bench_path", bench)
        raise CompareInputError(
            f"{where}: npu_path and bench_path need to be of the same type (two dump.json files or two step "
            f"directories); '{file_key}' {file_path} is a file, the other is a directory"
        )
    if npu.is_dir():
        for key, value in (("npu_path", npu), ("bench_path", bench)):
            try:
                find_rank_dirs(value)
            except CompareInputError as exc:
                raise CompareInputError(f"{where}: '{key}': {exc}") from None
        if stack is not None:
            logger.warning(
                "%s: 'stack_path' is ignored for step directories: each rank's stack.json is used", where
            )
            stack = None
    else:
        for key, value in (("npu_path", npu), ("bench_path", bench)):
            if not value.name.endswith(DUMP_JSON):
                raise CompareInputError(
                    f"{where}: '{key}' {value} must be a file whose name ends with {DUMP_JSON}"
                )
    if stack is not None:
        if not stack.exists():
            raise CompareInputError(f"{where}: 'stack_path' {stack} does not exist")
        if not stack.is_file():
            raise CompareInputError(
                f"{where}: 'stack_path' {stack} is a directory, expected a stack.json file"
            )
    return CompareSpec(
        npu_path=npu,
        bench_path=bench,
        stack_path=stack,
        is_print_compare_log=log_rows,
        source=Path(source) if source is not None else None,
    )


def _path_value(doc: Mapping[str, Any], key: str, where: str, *, required: bool) -> Path | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise CompareInputError(f"{where}: missing required key '{key}'")
        return None
    if not isinstance(value, str) or not value.strip():
        raise CompareInputError(f"{where}: '{key}' must be a non-empty path string, got {value!r}")
    return Path(value).expanduser()


def _warn_unknown_keys(doc: Mapping[str, Any], where: str) -> None:
    for key in doc:
        if key in KNOWN_KEYS:
            continue
        if key in MINDSPORE_KEYS:
            logger.warning("%s: key '%s' is MindSpore-only and is ignored", where, key)
            continue
        close = difflib.get_close_matches(str(key), KNOWN_KEYS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        logger.warning("%s: unknown key '%s' is ignored%s", where, key, hint)
