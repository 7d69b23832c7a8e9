"""The replay inside a compare: a ``Replayer`` over one rank's two dumps, which the engine's judgement
(``parity.shared.compare.replay_judgement``) calls with the entries it picks. The summary's ``replay``
document it leads to::

    {"verdicts": [ReplayVerdict.as_dict(), ...], "note": None, "replayed": 14}
    {"verdicts": [], "note": "statistics mode: no float64 replay (the dumps hold no tensors)"}

torch is imported on the first replay only: a statistics or md5 compare never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.shared.dump.layout import TENSOR_DIR
from parity.shared.replay.verdicts import ReplayVerdict

if TYPE_CHECKING:
    from parity.shared.replay.sandbox import ReplayBudget, WarmChild
    from parity.shared.tensor_io import TensorLimits

__all__ = ["StageFiles", "dump_replayer"]

#: ``stage(target files, bench files)``: fetch the named ``dump_tensor_data`` files, which the folder lacks,
#: before the replay reads them (a server worker that compared a slice of a rank holds that slice's files).
StageFiles = Callable[[Sequence[str], Sequence[str]], None]


def _lacking(dump_json: str | Path, entries: Sequence[str]) -> list[str]:
    """The tensor files a replay of ``entries`` reads that are not in the dump's folder yet."""
    from parity.shared.replay.engine import replay_files

    folder = Path(dump_json).parent / TENSOR_DIR
    return [name for name in replay_files(dump_json, entries) if not (folder / name).exists()]


Replay = Callable[..., list[ReplayVerdict]]


def dump_replayer(npu_dump: str | Path, bench_dump: str | Path, *, stage: StageFiles | None = None,
                  limits: TensorLimits | None = None,
                  budget: ReplayBudget | None = None, warm: WarmChild | None = None) -> Replay:  # fmt: skip
    """A replayer of entries of ``npu_dump`` (the target) against ``bench_dump``; ``stage`` fetches the
    tensor files they need first; ``limits`` caps each tensor load (None: the defaults); ``budget``: the
    replays run in a child process under it (``replay.sandbox``), None: in this process; ``warm``: that
    child, started ahead (with a budget only). Raises ``ParityError`` when a dump.json cannot be read."""

    def replay(entries: Sequence[str], partners: Mapping[str, str] | None = None, *,
               asked: Mapping[str, str] | None = None, identical: Sequence[str] = ()) -> list[ReplayVerdict]:
        """``partners``: the bench call of an entry paired under another name, ``""`` for a gap; ``asked``
        and ``identical`` as ``engine.replay_calls`` takes them."""
        if stage is not None:
            bench_entries = [p for p in (partners.get(e, e) if partners else e for e in entries) if p]
            stage(_lacking(npu_dump, entries), _lacking(bench_dump, bench_entries))
        extra: dict[str, Any] = {"limits": limits} if limits else {}
        if budget is not None:
            from parity.shared.replay.sandbox import replay_isolated

            return replay_isolated(npu_dump, bench_dump, entries, budget=budget, partners=partners,
                                   asked=asked, identical=identical, warm=warm, **extra)  # fmt: skip
        from parity.shared.replay.engine import replay_calls

        return replay_calls(npu_dump, bench_dump, entries, partners=partners, asked=asked,
                            identical=identical, **extra)

    return replay
