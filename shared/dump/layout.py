"""Where things are in a dump directory (dump-format.md §3): ``step*/rank*`` and the files of one rank.

msprobe writes ``{dump_path}/step{N}/rank{R}/{dump.json, stack.json, construct.json, dump_tensor_data/}``, or
``proc{pid}`` when torch.distributed was not initialised. Multi-rank compare pairs ranks by their number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from parity.shared.errors import CompareInputError

_RANK_DIR = re.compile(r"^rank(0|[1-9][0-9]*)?$")
_PROC_DIR = re.compile(r"^proc[0-9]+$")
_STEP_DIR = re.compile(r"^step(0|[1-9][0-9]*)$")

DUMP_JSON = "dump.json"
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
TENSOR_DIR = "dump_tensor_data"


@dataclass(frozen=True, slots=True)
class RankDir:
    """One rank's directory and the files msprobe puts next to each other in it."""

    path: Path
    rank: int | None  # None for a bare ``rank`` or a ``proc{pid}`` directory (a single-process run)

    @property
    def dump_json(self) -> Path:
        return self.path / DUMP_JSON

    @property
    def stack_json(self) -> Path:
        return self.path / STACK_JSON

    @property
    def construct_json(self) -> Path:
        return self.path / CONSTRUCT_JSON

    @property
    def tensor_dir(self) -> Path:
        return self.path / TENSOR_DIR


def rank_number(name: str) -> int | None:
    """``rank3`` → 3; ``rank`` → None. Raises ValueError for a name that is not a rank directory."""
    match = _RANK_DIR.match(name)
    if match is None:
        raise ValueError(f"not a rank directory name: {name!r}")
    return int(match.group(1)) if match.group(1) is not None else None


def find_rank_dirs(step_dir: str | Path) -> list[RankDir]:
    """The rank directories of one step directory, sorted by rank number.

    ``rank``/``rankN`` directories match ``^rank(0|[1-9][0-9]*)?$``; other entries are ignored (msprobe v1
    aborts on them, v2 skips them). When there is no rank directory, a single ``proc{pid}`` directory is taken
    (v2's fallback); several of them cannot be told apart and are refused.
    """
    step_dir = Path(step_dir)
    if not step_dir.exists():
        raise CompareInputError(f"{step_dir}: step directory not found")
    if not step_dir.is_dir():
        raise CompareInputError(f"{step_dir}: is a file, expected a step directory (the parent of rank*)")
    ranks: list[RankDir] = []
    procs: list[Path] = []
    for child in step_dir.iterdir():
        if not child.is_dir():
            continue
        if _RANK_DIR.match(child.name):
            ranks.append(RankDir(child, rank_number(child.name)))
        elif _PROC_DIR.match(child.name):
            procs.append(child)
    if ranks:
        ranks.sort(key=lambda r: -1 if r.rank is None else r.rank)
        return ranks
    if len(procs) == 1:
        return [RankDir(procs[0], None)]
    if procs:
        names = ", ".join(sorted(p.name for p in procs))
        raise CompareInputError(f"{step_dir}: several proc* directories ({names}) and no rank* directory")
    raise CompareInputError(f"{step_dir}: no rank* directory found")


def find_step_dirs(dump_path: str | Path) -> list[Path]:
    """The ``step{N}`` directories of a dump path, sorted by step number."""
    root = Path(dump_path)
    steps = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)] if root.is_dir() else []
    return sorted(steps, key=lambda p: int(p.name[4:]))


def sibling_stack_json(dump_json: str | Path) -> Path | None:
    """The stack.json next to a dump.json, when there is one (compare.md §1.1 auto-detection)."""
    candidate = Path(dump_json).parent / STACK_JSON
    return candidate if candidate.is_file() else None
