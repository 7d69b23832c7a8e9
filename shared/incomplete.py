"""A step cut short: the marker the client writes into a rank folder whose step did not end with ``step()``.

A process that raised between forward and backward (or ended while it was still recording) leaves a step
with some of its entries only: its dump.json is written at exit, as msprobe's is, so nothing recorded is
lost, and this file beside it says that the step is not whole and why. ``parity compare``, ``parity check``
and the server read it and compare such a step with a warning, never as a whole one. msprobe reads only
dump.json, stack.json, construct.json and the tensor files, so the marker changes nothing for it.

Light: standard library only (the client, the server and the compare all read it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["INCOMPLETE_FILE", "incomplete_lines", "incomplete_reason", "mark_incomplete"]

#: The marker's file name, in the rank folder beside dump.json.
INCOMPLETE_FILE = "parity_incomplete.json"


def mark_incomplete(rank_dir: Path, *, step: int, rank: int, reason: str) -> Path:
    """Write the marker of a step cut short into ``rank_dir`` (created when missing)."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    path = rank_dir / INCOMPLETE_FILE
    path.write_text(json.dumps({"step": step, "rank": rank, "reason": reason}) + "\n", encoding="utf-8")
    return path


def incomplete_reason(rank_dir: Path) -> str | None:
    """Why the step of ``rank_dir`` is not whole, or None when it is (no marker). A marker that cannot be
    read still marks the step: its presence is what counts."""
    path = rank_dir / INCOMPLETE_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "marked incomplete (its marker is unreadable)"
    reason = doc.get("reason") if isinstance(doc, dict) else None
    return str(reason) if reason else "marked incomplete"


def incomplete_lines(results: Iterable[Any]) -> list[str]:
    """One warning per compared side whose step is marked incomplete: ``results`` are the compare's per-rank
    results (``CompareResult``, with ``npu_path`` and ``bench_path`` the dump.json files compared)."""
    lines: list[str] = []
    for result in results:
        for side, dump_json in (("target", result.npu_path), ("bench", result.bench_path)):
            reason = incomplete_reason(Path(dump_json).parent) if dump_json else None
            if reason is not None:
                lines.append(f"the {side} dump {dump_json} is of a step cut short ({reason}): compared as it "
                             "is, not as a whole step")  # fmt: skip
    return lines
