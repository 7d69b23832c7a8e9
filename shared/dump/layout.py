"""Where things are in a dump directory (dump-format.md §3): ``step*/rank*`` and the files of one rank.

msprobe writes ``{dump_path}/step{N}/rank{R}/{dump.json, stack.json, construct.json, dump_tensor_data/}``, or
``proc{pid}`` when torch.distributed was not initialised. Multi-rank compare pairs ranks by their number.

Every rule about these folders lives here, once: the capture writes its rank folders with
:func:`rank_dir_path`, the uploaders find them with :func:`find_dump_ranks` and name them on the server with
:func:`stored_prefix`, the server reads the step and rank of an uploaded path with :func:`parse_stored_path`,
and compare pairs them with :func:`find_rank_dirs`.

msprobe's unnumbered folders (a bare ``rank``, or ``proc{pid}``) hold a single-process run. Such a folder is a
rank only when it is the only rank folder of its step: it then has no number (``RankDir.rank is None``) and
is stored as ``rank0`` on a server (:attr:`RankDir.number`). Beside numbered rank folders a bare ``rank``
cannot be paired with anything and is refused; ``proc{pid}`` folders are skipped there, as msprobe does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from parity.shared.errors import CompareInputError

_NUMBER = "(0|[1-9][0-9]*)"  # no leading zeros: ``rank01`` is not rank 1
_RANK_DIR = re.compile(rf"^rank{_NUMBER}?$")
_PROC_DIR = re.compile(r"^proc[0-9]+$")
_STEP_DIR = re.compile(rf"^step{_NUMBER}$")
_STORED_PREFIX = re.compile(rf"^step{_NUMBER}/rank{_NUMBER}/")

DUMP_JSON = "dump.json"
DEBUG_JSON = "debug.json"  # msprobe's name for the dump.json of a ``debug`` task
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
TENSOR_DIR = "dump_tensor_data"


@dataclass(frozen=True, slots=True)
class RankDir:
    """One rank's directory and the files msprobe puts next to each other in it."""

    path: Path
    rank: int | None  # None for a bare ``rank`` or a ``proc{pid}`` directory (a single-process run)

    @property
    def number(self) -> int:
        """The rank number this folder is stored under: an unnumbered single-process folder is rank 0."""
        return 0 if self.rank is None else self.rank

    @property
    def has_dump(self) -> bool:
        """Whether the folder holds a dump.json (or msprobe's debug.json)."""
        return any((self.path / name).is_file() for name in (DUMP_JSON, DEBUG_JSON))

    @property
    def dump_json(self) -> Path:
        return self.path / DUMP_JSON

    @property
    def tensor_dir(self) -> Path:
        return self.path / TENSOR_DIR


def step_dir_name(step: int) -> str:
    """``3`` → ``step3``."""
    return f"step{step}"


def rank_dir_name(rank: int) -> str:
    """``3`` → ``rank3``."""
    return f"rank{rank}"


def rank_dir_path(dump_path: str | Path, step: int, rank: int) -> Path:
    """Where the capture writes one rank of one step: ``{dump_path}/step{step}/rank{rank}``."""
    return Path(dump_path) / step_dir_name(step) / rank_dir_name(rank)


def stored_prefix(step: int, rank: int) -> str:
    """The path of a rank folder under a run's dump root on a server: ``step{step}/rank{rank}``."""
    return f"{step_dir_name(step)}/{rank_dir_name(rank)}"


def parse_stored_path(path: str) -> tuple[int, int] | None:
    """``(step, rank)`` of a stored path ``step{N}/rank{R}/...``; None for any other path."""
    match = _STORED_PREFIX.match(path)
    return (int(match.group(1)), int(match.group(2))) if match else None


def step_number(name: str) -> int | None:
    """``step3`` → 3; None for a name that is not a step folder."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def rank_number(name: str) -> int | None:
    """``rank3`` → 3; ``rank`` → None. Raises ValueError for a name that is not a rank directory."""
    match = _RANK_DIR.match(name)
    if match is None:
        raise ValueError(f"not a rank directory name: {name!r}")
    return int(match.group(1)) if match.group(1) is not None else None


def find_rank_dirs(step_dir: str | Path) -> list[RankDir]:
    """The rank directories of one step directory, sorted by rank number.

    ``rankN`` directories match ``^rank(0|[1-9][0-9]*)$``; other entries are ignored (msprobe v1 aborts on
    them, v2 skips them). An unnumbered ``rank`` or ``proc{pid}`` directory is taken only as the step's one
    rank (v2's fallback); beside numbered ranks a ``rank`` directory is refused and ``proc*`` ones skipped,
    and several unnumbered ones cannot be told apart and are refused.
    """
    step_dir = Path(step_dir)
    if not step_dir.exists():
        raise CompareInputError(f"{step_dir}: step directory not found")
    if not step_dir.is_dir():
        raise CompareInputError(f"{step_dir}: is a file, expected a step directory (the parent of rank*)")
    numbered: list[RankDir] = []
    bare: Path | None = None
    procs: list[Path] = []
    for child in step_dir.iterdir():
        if not child.is_dir():
            continue
        if _RANK_DIR.match(child.name):
            rank = rank_number(child.name)
            if rank is None:
                bare = child
            else:
                numbered.append(RankDir(child, rank))
        elif _PROC_DIR.match(child.name):
            procs.append(child)
    if numbered and bare is not None:
        names = ", ".join(["rank", *sorted(d.path.name for d in numbered)])
        raise CompareInputError(
            f"{step_dir}: cannot number its rank folders ({names}): an unnumbered 'rank' folder is a rank "
            "only when it is the only rank folder of its step"
        )
    if numbered:
        return sorted(numbered, key=lambda r: r.number)
    if bare is not None:
        return [RankDir(bare, None)]
    if len(procs) == 1:
        return [RankDir(procs[0], None)]
    if procs:
        names = ", ".join(sorted(p.name for p in procs))
        raise CompareInputError(f"{step_dir}: several proc* directories ({names}) and no rank* directory")
    if (step_dir / DUMP_JSON).is_file():  # a rank folder given for a step folder (issue 36)
        raise CompareInputError(f"{step_dir}: a rank folder (it holds dump.json), not a step folder: give "
                                f"{step_dir / DUMP_JSON} for this rank, or {step_dir.parent} for every rank")
    steps = sorted(c.name for c in step_dir.iterdir() if c.is_dir() and c.name.startswith("step"))
    where = f" (a dump root? give one of its step folders: {', '.join(steps[:3])})" if steps else \
        f" (expected {step_dir}/rank0/{DUMP_JSON} ...)"  # fmt: skip
    raise CompareInputError(f"{step_dir}: no rank* directory found{where}")


def find_step_dirs(dump_path: str | Path) -> list[Path]:
    """The ``step{N}`` directories of a dump path, sorted by step number."""
    root = Path(dump_path)
    steps = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)] if root.is_dir() else []
    return sorted(steps, key=lambda p: int(p.name[4:]))


def find_dump_ranks(path: str | Path) -> list[tuple[int, RankDir]]:
    """``(step, rank folder)`` for every rank under ``path``, sorted by step then rank.

    ``path`` is a dump root (``step*/rank*``), one step folder, or one rank folder (a folder holding
    dump.json, whatever its name: rank 0 unless named ``rank{N}``, step 0 unless its parent is a ``step{N}``).
    """
    path = Path(path)
    if not path.is_dir():
        raise CompareInputError(f"{path}: not a directory")
    lone = RankDir(path, None)
    if lone.has_dump:
        rank = rank_number(path.name) if _RANK_DIR.match(path.name) else None
        return [(step_number(path.parent.name) or 0, RankDir(path, rank))]
    step = step_number(path.name)
    if step is not None:
        return [(step, r) for r in find_rank_dirs(path)]
    found = [(int(d.name[4:]), r) for d in find_step_dirs(path) for r in find_rank_dirs(d)]
    if not found:
        raise CompareInputError(
            f"{path}: no step*/rank* folders (expected a dump root such as DUMP_DIR/step0/rank0/dump.json, "
            "a step folder, or a rank folder holding dump.json)"
        )
    return found


def sibling_stack_json(dump_json: str | Path) -> Path | None:
    """The stack.json next to a dump.json, when there is one (compare.md §1.1 auto-detection)."""
    candidate = Path(dump_json).parent / STACK_JSON
    return candidate if candidate.is_file() else None
