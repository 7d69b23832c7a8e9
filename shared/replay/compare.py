"""The replay inside a compare: the top suspects and the first divergence of a tensor-mode result, replayed
on both sides, as the summary's ``replay`` document::

    {"verdicts": [ReplayVerdict.as_dict(), ...], "note": None}
    {"verdicts": [], "note": "statistics mode: no float64 replay (the dumps hold no tensors)"}

Statistics and md5 dumps hold no tensors, so they get the note instead (said once per rank). The replay never
fails a compare: a dump.json it cannot read becomes the note.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.shared.compare.headers import CompareMode
from parity.shared.errors import ParityError

if TYPE_CHECKING:
    from parity.shared.compare.result import CompareResult

__all__ = ["NO_TENSORS_NOTE", "REPLAY_TOP", "replay_entries_of", "replay_summary"]

logger = logging.getLogger(__name__)

REPLAY_TOP = 10  # the engine's REPLAY_TOP, kept here so that a compare without tensors never imports torch
NO_TENSORS_NOTE = "{mode} mode: no float64 replay (the dumps hold no tensors)"
#: ``stage(target files, bench files)``: fetch the named ``dump_tensor_data`` files, which the folder lacks,
#: before the replay reads them (a server worker that compared a slice of a rank holds that slice's files).
StageFiles = Callable[[Sequence[str], Sequence[str]], None]


def replay_entries_of(result: CompareResult, limit: int = REPLAY_TOP) -> list[str]:
    """The entries a compare replays: its top ``limit`` suspects, then the first divergence if not among
    them."""
    entries = [s.api for s in result.suspects[:limit]] if limit > 0 else []
    first = result.first_divergence
    if limit > 0 and first is not None and first.api not in entries:
        entries.append(first.api)
    return entries


def _lacking(dump_json: str | Path, entries: Sequence[str]) -> list[str]:
    """The tensor files a replay of ``entries`` reads that are not in the dump's folder yet."""
    from parity.shared.replay.engine import replay_files

    folder = Path(dump_json).parent / "dump_tensor_data"
    return [name for name in replay_files(dump_json, entries) if not (folder / name).exists()]


def replay_summary(
    result: CompareResult,
    npu_dump: str | Path,
    bench_dump: str | Path,
    *,
    limit: int = REPLAY_TOP,
    stage: StageFiles | None = None,
) -> dict[str, Any] | None:
    """The ``replay`` document of one compared rank; None when ``limit`` is 0 (replay switched off)."""
    if limit <= 0:
        return None
    if result.mode is not CompareMode.TENSOR:
        return {"verdicts": [], "note": NO_TENSORS_NOTE.format(mode=result.mode.value)}
    entries = replay_entries_of(result, limit)
    if not entries:
        return {"verdicts": [], "note": "no suspect to replay"}
    from parity.shared.replay.engine import replay_calls

    try:
        if stage is not None:
            stage(_lacking(npu_dump, entries), _lacking(bench_dump, entries))
        verdicts = replay_calls(npu_dump, bench_dump, entries)
    except ParityError as exc:
        logger.warning("float64 replay not run: %s", exc)
        return {"verdicts": [], "note": f"not run: {exc}"}
    return {"verdicts": [v.as_dict() for v in verdicts], "note": None}
