"""The next dump's plan from a comparison: tensor files for its suspects (and their neighbours) only.

msprobe's guide has users dump statistics over the whole model first, then run again in tensor mode with
``list`` naming the suspects. :func:`make_plan` reads a comparison's summary (the ``compare_summary.json``
document of ``parity compare`` or the server's) and picks the calls: the ``top`` suspects by score across
ranks (and the first divergence, when it is not among them), plus, with ``neighbours`` K, the calls within K
steps of data flow of them (:mod:`parity.shared.plan.dataflow`, read from the target side's dump). Each call
is listed by both of its entries, forward and backward, so the replay and the gradients of a suspect come
with it. :meth:`Plan.config` writes it as msprobe's config.json: task ``tensor``, ``list``, the step and
ranks where the runs diverged, and one field of Parity's own in the task section
(``parity_statistics_for_all``, which msprobe ignores): Parity's client then records every call's
statistics as before and writes tensor files for the listed calls only, so the new dump's names and call
indices match the statistics run's entry for entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.shared.dump.naming import parse_entry
from parity.shared.errors import ParityError
from parity.shared.plan.dataflow import DataFlow, order_of

__all__ = ["DEFAULT_NEIGHBOURS", "DEFAULT_TOP", "STATISTICS_FOR_ALL", "DumpLoader", "Plan", "PlanError",
           "PlannedCall", "call_entries", "make_plan"]  # fmt: skip

#: The task-section field of Parity's own that a planned config carries: statistics for every call, tensor
#: files for the listed ones. msprobe 8.3.3 reads the fields it knows and ignores the rest.
STATISTICS_FOR_ALL = "parity_statistics_for_all"
#: The summary documents a plan is read from (``parity.shared.report.summary``).
SUMMARY_FORMAT_VERSION = 1
SUMMARY_KINDS = ("single-rank", "multi-rank")
#: How many suspects a plan takes, and how many data-flow steps around them (``parity plan``, the server and
#: the client's fetch alike).
DEFAULT_TOP = 10
DEFAULT_NEIGHBOURS = 1
#: The default folder of a planned dump (a config needs one; the user's own config.json overrides it).
DEFAULT_DUMP_PATH = "./parity_plan_dump"

#: ``loader(rank, npu_path)``: the target side's dump.json document of one rank, or None where it is not at
#: hand. The CLI reads the file the summary names; the server gives ``{"level": ..., "data": DataFlow}``
#: from the columns its workers stored (never a dump.json parsed in the API process).
DumpLoader = Callable[[int | None, str | None], Mapping[str, Any] | None]

_STEP_DIR = re.compile(r"(?:^|[/\\])step(0|[1-9][0-9]*)(?:[/\\]|$)")


class PlanError(ParityError):
    """No plan can be read from this input: a summary of another format, or the dump the neighbours need."""


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One call of the plan: a suspect (with its score) or a neighbour of one, on one rank."""

    api: str
    rank: int | None
    role: str  # "suspect", "first divergence" or "neighbour"
    score: float | None = None


@dataclass(frozen=True)
class Plan:
    """What the next dump records in tensor mode; ``ranks``/``steps`` empty mean all (msprobe's ``[]``)."""

    calls: list[PlannedCall]
    steps: list[int]
    ranks: list[int]
    level: str
    mode: str | None = None
    comparison: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def suspects(self) -> list[PlannedCall]:
        return [c for c in self.calls if c.role != "neighbour"]

    @property
    def entries(self) -> list[str]:
        """msprobe's ``list``: both entries of every planned call, each once, suspects first."""
        out: dict[str, None] = {}
        for call in self.calls:
            out.update(dict.fromkeys(call_entries(call.api)))
        return list(out)

    def config(self, dump_path: str = DEFAULT_DUMP_PATH) -> dict[str, Any]:
        """The plan as msprobe's config.json (a dict to write as JSON); ``planned_by`` names the comparison
        (Parity's run provenance; msprobe ignores it)."""
        doc: dict[str, Any] = {
            "task": "tensor",
            "dump_path": dump_path,
            "rank": list(self.ranks),
            "step": list(self.steps),
            "level": self.level,
            "async_dump": False,
            "tensor": {"scope": [], "list": self.entries, "data_mode": ["all"], STATISTICS_FOR_ALL: True},
        }
        if self.comparison is not None:
            doc["planned_by"] = self.comparison
        return doc


def call_entries(api: str) -> list[str]:
    """Both entries of the call ``api`` names (forward and backward), the given one first; a name that is
    not a call entry (a parameter gradient, an unknown grammar) alone."""
    parsed = parse_entry(api)
    partner = parsed.partner if parsed is not None else None
    return [api] if partner is None else [api, partner]


def _rank_documents(summary: Any) -> list[Mapping[str, Any]]:
    """The per-rank documents of a summary; a document of another format is a :class:`PlanError`."""
    if not isinstance(summary, Mapping):
        raise PlanError("not a compare summary: the top level must be a JSON object")
    version, kind = summary.get("format_version"), summary.get("kind")
    if version != SUMMARY_FORMAT_VERSION or kind not in SUMMARY_KINDS:
        expected = " or ".join(SUMMARY_KINDS)
        raise PlanError(f"not a compare summary of format {SUMMARY_FORMAT_VERSION} (format_version "
                        f"{version!r}, kind {kind!r}; expected kind {expected})")  # fmt: skip
    docs = summary.get("ranks") if kind == "multi-rank" else [summary]
    if not isinstance(docs, list) or not all(isinstance(d, Mapping) for d in docs):
        raise PlanError("compare summary: 'ranks' must be a list of rank documents")
    for i, doc in enumerate(docs):
        if not isinstance(doc.get("suspects", []), list):
            raise PlanError(f"compare summary: ranks[{i}].suspects must be a list")
    return docs


def _suspect(doc: Mapping[str, Any], item: Any, where: str) -> tuple[str, float]:
    if not isinstance(item, Mapping) or not isinstance(item.get("api"), str):
        raise PlanError(f"compare summary: {where} has no 'api' name")
    score = item.get("score")
    return item["api"], float(score) if isinstance(score, (int, float)) else 0.0


def _steps_of(docs: Sequence[Mapping[str, Any]]) -> list[int]:
    steps = set()
    for doc in docs:
        found = _STEP_DIR.findall(str(doc.get("npu_path") or ""))
        if found:
            steps.add(int(found[-1]))
    return sorted(steps)


def _level_of(dumps: Sequence[Mapping[str, Any]], calls: Sequence[PlannedCall]) -> str:
    """The statistics run's level (its dump.json says), so the new dump names its calls alike."""
    for dump in dumps:
        level = dump.get("level")
        if isinstance(level, str) and level:
            return level
    return "mix" if any(c.api.startswith("Module.") for c in calls) else "L1"


def make_plan(
    summary: Any,
    *,
    top: int = DEFAULT_TOP,
    neighbours: int = DEFAULT_NEIGHBOURS,
    step: int | None = None,
    load_dump: DumpLoader | None = None,
    comparison: str | None = None,
) -> Plan:
    """The plan of a comparison's summary (module docstring). ``step``: the compared step (else read from
    the summary's dump paths; none found: every step). ``load_dump`` gives the target dump of a rank, which
    ``neighbours`` > 0 needs and which names the level. A comparison without suspects gives a plan without
    calls (``plan.calls == []``): there is nothing to dump in tensor mode."""
    if top < 1:
        raise PlanError(f"top must be at least 1, got {top}")
    if neighbours < 0:
        raise PlanError(f"neighbours must be 0 or more, got {neighbours}")
    docs = _rank_documents(summary)
    ranked: list[tuple[float, int, PlannedCall]] = []
    firsts: list[PlannedCall] = []
    for k, doc in enumerate(docs):
        rank = doc.get("rank")
        rank = rank if isinstance(rank, int) else None
        for i, item in enumerate(doc.get("suspects") or []):
            api, score = _suspect(doc, item, f"ranks[{k}].suspects[{i}]")
            ranked.append((-score, len(ranked), PlannedCall(api, rank, "suspect", score)))
        first = doc.get("first_divergence")
        if first:
            api, score = _suspect(doc, first, f"ranks[{k}].first_divergence")
            firsts.append(PlannedCall(api, rank, "first divergence", score))
    chosen = [call for _, _, call in sorted(ranked)[:top]]
    keys = {(c.rank, c.api) for c in chosen}
    for first in firsts:
        if (first.rank, first.api) not in keys:
            keys.add((first.rank, first.api))
            chosen.append(first)
    mode = next((d.get("mode") for d in docs if d.get("mode")), None)
    steps = [step] if step is not None else _steps_of(docs)
    if not chosen:
        return Plan([], steps, [], "L1", mode, comparison, ["the comparison has no suspects"])
    dumps: dict[int | None, Mapping[str, Any]] = {}
    needed = {c.rank for c in chosen}
    for doc in docs:
        rank = doc.get("rank") if isinstance(doc.get("rank"), int) else None
        if rank in needed and load_dump is not None and rank not in dumps:
            npu_path = doc.get("npu_path")
            found = load_dump(rank, npu_path if isinstance(npu_path, str) else None)
            if found is not None:
                dumps[rank] = found
    calls = list(chosen)
    notes: list[str] = []
    if neighbours:
        for rank in sorted(needed, key=lambda r: -1 if r is None else r):
            dump = dumps.get(rank)
            data = dump.get("data") if dump is not None else None
            if not isinstance(data, (Mapping, DataFlow)):
                where = f"rank {rank}" if rank is not None else "the compared rank"
                raise PlanError(f"--neighbours needs the target dump.json of {where}, which is not at hand "
                                "(moved or deleted?); plan without neighbours, or from the server's "
                                "comparison id")  # fmt: skip
            flow = data if isinstance(data, DataFlow) else DataFlow(data)
            seeds = [e for c in chosen if c.rank == rank for e in call_entries(c.api)]
            known = {e for c in calls if c.rank == rank for e in call_entries(c.api)}
            for name in order_of(flow.neighbours(seeds, neighbours), flow):
                if name not in known:
                    known.update(call_entries(name))
                    calls.append(PlannedCall(name, rank, "neighbour"))
    ranks = sorted({c.rank for c in chosen if c.rank is not None})
    if len(docs) <= 1 and ranks in ([], [0]):
        ranks = []  # one compared rank: msprobe wants [] on a single card (a rank filter there dumps nothing)
    return Plan(calls, steps, ranks, _level_of(list(dumps.values()), chosen), mode, comparison, notes)
