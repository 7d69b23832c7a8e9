"""Baselines and regressions: a project's known-good run, the comparison queued against it when a run
completes, failing APIs judged new or known, notes that accept an API, an API's error across comparisons,
and what differs between two runs' environments.

A comparison is *against the baseline* when its bench run was its project's baseline when it was queued
(``Comparison.against_baseline``). Each API that fails in it, or failed in the previous comparison, is judged
new, worse, known or fixed by its error (``parity.shared.report.regressions``, the one rule) against the
project's previous succeeded comparison with the same bench run (and the same ``against_baseline``) and the
notes that accepted it. An API's error is the largest max relative error of its calls over the compared
ranks (the ``comparison_calls`` the chart reads). Comparisons not against the baseline are judged the same
way (``parity check --baseline RUN``); the pages show the verdicts of comparisons against the baseline only.
Every list of runs shows each run's verdict against the baseline there is now (``with_verdicts``).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity.server.db import Database
from parity.server.errors import NotFound, Unprocessable
from parity.server.models import ApiAcceptance, Comparison, ComparisonCall, Run, RunFile, RunTag, utcnow
from parity.server.repositories import RunRepository
from parity.server.schemas import (
    AcceptanceCreate,
    AcceptancePublic,
    AcceptancesPublic,
    ApiHistoryPoint,
    ApiHistoryPublic,
    BaselineVerdict,
    ComparisonCreate,
    ComparisonPublic,
    EnvironmentChange,
    EnvironmentDiff,
    RegressionsPublic,
    RunPublic,
    RunUpdate,
)
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService, refuse_taken_name, resolve_run
from parity.shared.compare.localization import forward_of, user_frame
from parity.shared.dump.layout import STACK_JSON, stored_prefix
from parity.shared.dump.reader import load_stack
from parity.shared.errors import ParityError
from parity.shared.report.regressions import judge_apis, summary_stacks
from sqlalchemy import delete, func, select, update

logger = logging.getLogger(__name__)

#: The largest stack.json read for the stack lines of a comparison's regressions.
STACK_JSON_LIMIT = 64 * 1024 * 1024

#: Comparisons an API's history reaches back over (newest first), enough for months of nightly runs.
HISTORY_LIMIT = 500



def _environment(meta: dict[str, Any]) -> dict[str, Any]:
    """A run's recorded environment flattened to ``key -> value``; ``packages`` and ``env`` are nested
    dicts in the client's metadata and come out as ``packages.NAME`` and ``env.NAME``."""
    flat: dict[str, Any] = {}
    for key, value in meta.items():
        if key in ("packages", "env") and isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        elif key not in ("argv", "dump_path"):  # differ on every run, and say nothing of the environment
            flat[key] = value
    return flat


def environment_diff(target_meta: dict[str, Any], bench_meta: dict[str, Any]) -> EnvironmentDiff:
    target, bench = _environment(target_meta), _environment(bench_meta)
    changed: list[EnvironmentChange] = []
    packages: list[EnvironmentChange] = []
    same = 0
    for key in sorted(set(target) | set(bench)):
        a, b = target.get(key), bench.get(key)
        if a == b:
            same += 1
            continue
        change = EnvironmentChange(key=key.removeprefix("packages."), target=a, bench=b)
        (packages if key.startswith("packages.") else changed).append(change)
    return EnvironmentDiff(changed=changed, packages_changed=packages, same=same)


class BaselineService:
    def __init__(self, db: Database, runs: RunService, comparisons: ComparisonService) -> None:
        self.db = db
        self.runs = runs
        self.comparisons = comparisons

    # -- PATCH /runs/{id} -------------------------------------------------------------------------------
    def update_run(self, run_id: str, body: RunUpdate) -> RunPublic:
        """Rename, retag, or make the run its project's baseline (the previous one stops being it)."""
        with self.db.write() as session:
            run = resolve_run(RunRepository(session), run_id, for_update=True)  # an id or a name
            run_id = run.id
            if body.name is not None and body.name != run.name:
                # Names are unique in a project (RunService.create): a rename must not bring back the
                # ambiguity that made ``compare-runs NAME`` fail.
                refuse_taken_name(session, run.project, body.name, "choose another name", renamed=run_id)
                run.name = body.name
            if body.tags is not None:
                run.tags = dict(body.tags)
                session.execute(delete(RunTag).where(RunTag.run_id == run_id))
                session.add_all(RunTag(run_id=run_id, key=k, value=v) for k, v in body.tags.items())
            if body.baseline is True and not run.baseline:
                others = update(Run).where(Run.project == run.project, Run.baseline.is_(True))
                session.execute(others.values(baseline=False))
                run.baseline = True
                logger.info("run %s is now project %s's baseline", run_id, run.project)
            elif body.baseline is False:
                run.baseline = False
        return self.runs.get(run_id)

    def baseline_of(self, project: str) -> RunPublic | None:
        with self.db.read() as session:
            run_id = session.scalar(select(Run.id).where(Run.project == project, Run.baseline.is_(True)))
        return self.runs.get(run_id) if run_id is not None else None

    # -- every list's verdict --------------------------------------------------------------------------
    def with_verdicts(self, runs: Sequence[RunPublic]) -> list[RunPublic]:
        """``runs``, each with its verdict against its project's baseline (``RunPublic.verdict``): the
        verdicts of its latest comparison against the baseline there is now. A few reads for the page, then
        one ``regressions`` per run compared (a page of runs: 50)."""
        projects = {r.project for r in runs}
        ids = [r.id for r in runs if not r.baseline]
        with self.db.read() as session:
            baselines = {
                project: (run_id, name)
                for run_id, name, project in session.execute(
                    select(Run.id, Run.name, Run.project)
                    .where(Run.project.in_(projects), Run.baseline.is_(True))
                )
            }  # fmt: skip
            latest: dict[tuple[str, str], tuple[str, str]] = {}
            for cid, target, bench, status in session.execute(
                select(Comparison.id, Comparison.target_run_id, Comparison.bench_run_id, Comparison.status)
                .where(Comparison.target_run_id.in_(ids), Comparison.against_baseline.is_(True))
                .order_by(Comparison.created_at)
            ):  # fmt: skip
                latest[(target, bench)] = (cid, status)  # the newest last
        return [r.model_copy(update={"verdict": self._verdict(r, baselines.get(r.project), latest)})
                for r in runs]  # fmt: skip

    def _verdict(self, run: RunPublic, baseline: tuple[str, str] | None,
                 latest: dict[tuple[str, str], tuple[str, str]]) -> BaselineVerdict:  # fmt: skip
        if run.baseline:
            return BaselineVerdict(verdict="baseline", baseline_run=run.id, baseline_name=run.name)
        if baseline is None:
            return BaselineVerdict(verdict="not compared", note=f"project {run.project!r} has no baseline")
        base_id, base_name = baseline
        found = latest.get((run.id, base_id))
        if found is None:
            note = run.auto_compare_note or (
                f"the run is {run.status}" if run.status != "complete"
                else "created with auto_compare off" if not run.auto_compare
                else f"no comparison with baseline {base_name} yet"
            )  # fmt: skip
            return BaselineVerdict(verdict="not compared", baseline_run=base_id, baseline_name=base_name,
                                   note=note)  # fmt: skip
        cid, status = found
        known = {"baseline_run": base_id, "baseline_name": base_name, "comparison": cid}
        if status in ("queued", "running"):
            return BaselineVerdict(verdict="pending", **known)
        if status != "succeeded":
            return BaselineVerdict(verdict="failed", **known)
        r = self.regressions(cid)
        return BaselineVerdict(verdict=r.overall(), new=r.new, worse=r.worse, known=r.known, fixed=r.fixed,
                               **known)  # fmt: skip

    # -- auto-compare -----------------------------------------------------------------------------------
    def compare_with_baseline(self, run_id: str) -> ComparisonPublic | None:
        """Queue ``run_id`` (just completed) against its project's baseline; None when it opted out, is
        the baseline itself, the project has no complete baseline, or the two cannot be compared. Never
        raises for those: completing a run must not fail because its comparison cannot be made. Why a due
        comparison was not queued is kept on the run (``auto_compare_note``, shown on its page).

        A tensor dump against a statistics baseline is compared in statistics mode (the engine's
        ``detect_mode``: a tensor dump carries the statistics too). Dumps that could not be compared (md5
        checksums against statistics without; another task) are skipped up front, from what validation
        recorded of each (``Run.dump_task``, :func:`task_mismatch`), not queued to fail in a worker."""
        with self.db.read() as session:
            run = session.get(Run, run_id)
            if run is None or not run.auto_compare or run.baseline or run.status != "complete":
                return None
            baseline = session.scalars(
                select(Run).where(Run.project == run.project, Run.baseline.is_(True))
            ).first()
            if baseline is None:
                return None
            baseline_id, baseline_name, baseline_status = baseline.id, baseline.name, baseline.status
            mismatch = task_mismatch(run.dump_task, baseline.dump_task)
        if baseline_status != "complete":
            self._note(run_id, f"not compared with baseline {baseline_name}: it is {baseline_status}")
            return None
        if mismatch is not None:
            logger.info("run %s: not compared with baseline %s: %s", run_id, baseline_id, mismatch)
            self._note(run_id, f"not compared with baseline {baseline_name}: {mismatch}")
            return None
        try:
            comparison = self.comparisons.create(ComparisonCreate(target_run=run_id, bench_run=baseline_id))
        except Exception as exc:  # noqa: BLE001 - reported on the run and in the log, the completion stands
            logger.warning("run %s: no comparison against baseline %s: %s", run_id, baseline_id, exc)
            self._note(run_id, f"not compared with baseline {baseline_name}: {exc}")
            return None
        self._note(run_id, None)
        return comparison

    def _note(self, run_id: str, note: str | None) -> None:
        with self.db.write() as session:
            run = session.get(Run, run_id)
            if run is not None:
                run.auto_compare_note = note[:2000] if note else None

    # -- new, worse, known, fixed -----------------------------------------------------------------------
    def regressions(self, comparison_id: str) -> RegressionsPublic:
        """Each API of the comparison failing now or in the previous comparison, judged new, worse, known or
        fixed; new and worse first, each group in execution order (see the module's docstring)."""
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            failing = list((c.summary or {}).get("failing_apis", []))
            project = session.scalar(select(Run.project).where(Run.id == c.target_run_id)) or ""
            previous = session.scalars(
                select(Comparison)
                .join(Run, Run.id == Comparison.target_run_id)
                .where(
                    Run.project == project, Comparison.bench_run_id == c.bench_run_id,
                    Comparison.against_baseline.is_(bool(c.against_baseline)),
                    Comparison.status == "succeeded", Comparison.created_at < c.created_at,
                    Comparison.id != c.id,
                )  # fmt: skip
                .order_by(Comparison.created_at.desc())
            ).first()
            before_failing = list((previous.summary or {}).get("failing_apis", [])) if previous else []
            apis = set(failing) | set(before_failing)
            accepted = {
                a.api: a
                for a in session.scalars(
                    select(ApiAcceptance).where(ApiAcceptance.project == project, ApiAcceptance.api.in_(apis))
                )
            }
            now = api_errors(session, c.id, apis)
            then = api_errors(session, previous.id, apis) if previous is not None else {}
            order = call_order(session, c.id, apis)
            summary = dict(c.summary or {})
        return judge_apis(failing, now, before_failing, then, order=order, accepted=accepted,
                          stacks=summary_stacks(summary), against_baseline=bool(c.against_baseline),
                          previous_comparison=previous.id if previous else None)  # fmt: skip

    def with_stack_lines(self, found: RegressionsPublic, comparison_id: str) -> RegressionsPublic:
        """``found`` with the stack line of each new or worse API the comparison's suspects did not name,
        read from the target run's stack.json (of the comparison's step and first rank, at most
        :data:`STACK_JSON_LIMIT` bytes): the line of the user's code a gate's report names."""
        missing = {v.api for v in found.data if v.verdict in ("new", "worse") and not v.stack}
        if not missing:
            return found
        stacks = self._stacks(comparison_id)
        if not stacks:
            return found
        data = []
        for v in found.data:
            frames = stacks.get(v.api) or stacks.get(forward_of(v.api)) if v.api in missing else None
            line = user_frame(frames) or (frames[0] if frames else None)
            data.append(v.model_copy(update={"stack": line}) if line else v)
        return found.model_copy(update={"data": data})

    def _stacks(self, comparison_id: str) -> dict[str, list[str]]:
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            if c is None or not c.summary:
                return {}
            ranks = (c.summary or {}).get("compared_ranks") or [0]
            path = f"{stored_prefix(c.step or 0, int(ranks[0] or 0))}/{STACK_JSON}"
            row = session.execute(
                select(RunFile.blob, RunFile.size)
                .where(RunFile.run_id == c.target_run_id, RunFile.path == path)
            ).first()  # fmt: skip
        if row is None or row.size > STACK_JSON_LIMIT:
            return {}
        store = self.comparisons.store
        try:
            local = store.local_path(row.blob)
            if local is not None:
                return load_stack(local)
            with tempfile.TemporaryDirectory() as tmp:
                dest = Path(tmp) / STACK_JSON
                store.download(row.blob, dest)
                return load_stack(dest)
        except (OSError, ParityError) as exc:  # a stack line is a help, never a reason to fail the answer
            logger.warning("comparison %s: no stack lines from %s: %s", comparison_id, path, exc)
            return {}

    def _require_project(self, session: Any, project: str) -> None:
        if session.scalar(select(Run.id).where(Run.project == project).limit(1)) is None:
            raise NotFound(f"project {project!r} not found (no run has it)")

    def accept(self, project: str, body: AcceptanceCreate, who: str) -> AcceptancePublic:
        """Accept ``body.api`` in ``project`` with a note (again: the note is replaced). ``who`` is the
        authenticated identity and is what ``accepted_by`` records; ``body.author`` is free text kept
        beside it, so no one can accept under another's name."""
        author = body.author.strip() if body.author and body.author.strip() else None
        with self.db.write() as session:
            self._require_project(session, project)
            level = self._latest_error(session, project, body.api)
            row = session.get(ApiAcceptance, (project, body.api))
            if row is None:
                row = ApiAcceptance(project=project, api=body.api, note=body.note, accepted_by=who,
                                    author=author, created_at=utcnow(), level=level)  # fmt: skip
                session.add(row)
            else:
                row.note, row.accepted_by, row.author, row.created_at = body.note, who, author, utcnow()
                row.level = level
            return _acceptance_public(row)

    def revoke(self, project: str, api: str) -> None:
        """Withdraw the acceptance of ``api``: it is judged new or known by its history again."""
        with self.db.write() as session:
            self._require_project(session, project)
            row = session.get(ApiAcceptance, (project, api))
            if row is None:
                raise NotFound(f"api {api!r}: not accepted in project {project!r}")
            session.delete(row)
        logger.info("acceptance of %s in project %s revoked", api, project)

    def _latest_error(self, session: Any, project: str, api: str) -> float | None:
        """``api``'s error in the newest comparison of ``project`` that has it among its calls: the level an
        acceptance accepts. An API no comparison of the project ever had is a 422 (a typo accepted would
        hide nothing and mislead the reader)."""
        newest = session.execute(
            select(ComparisonCall.comparison_id)
            .join(Comparison, Comparison.id == ComparisonCall.comparison_id)
            .join(Run, Run.id == Comparison.target_run_id)
            .where(Run.project == project, ComparisonCall.api == api)
            .order_by(Comparison.created_at.desc()).limit(1)
        ).scalar()  # fmt: skip
        if newest is None:
            raise Unprocessable(f"api: {api!r} is in none of project {project!r}'s comparisons")
        return api_errors(session, newest, {api}).get(api)

    def acceptances(self, project: str) -> AcceptancesPublic:
        with self.db.read() as session:
            self._require_project(session, project)
            rows = session.scalars(
                select(ApiAcceptance).where(ApiAcceptance.project == project).order_by(ApiAcceptance.api)
            ).all()
            data = [_acceptance_public(r) for r in rows]
        return AcceptancesPublic(data=data, count=len(data))

    # -- history and environment ------------------------------------------------------------------------
    def api_history(self, project: str, api: str, *, step: int | None = None, mode: str | None = None,
                    rank: int | None = None) -> ApiHistoryPublic:  # fmt: skip
        """``api``'s error in each succeeded comparison of ``project`` (by target run), oldest first, each
        point with its comparison's step and mode (``step``, ``mode``, ``rank`` narrow them). 404 for a
        project no run has, 422 for an API none of its comparisons had."""
        with self.db.read() as session:
            self._require_project(session, project)
            recent = (
                select(Comparison.id)
                .join(Run, Run.id == Comparison.target_run_id)
                .where(Run.project == project, Comparison.status == "succeeded")
                .order_by(Comparison.created_at.desc())
                .limit(HISTORY_LIMIT)
                .scalar_subquery()
            )
            stmt = (
                select(ComparisonCall, Comparison.created_at, Comparison.target_run_id,
                       Comparison.bench_run_id, Run.name, Comparison.step, Comparison.summary)
                .join(Comparison, Comparison.id == ComparisonCall.comparison_id)
                .join(Run, Run.id == Comparison.target_run_id)
                .where(ComparisonCall.api == api, ComparisonCall.comparison_id.in_(recent))
                .order_by(Comparison.created_at, ComparisonCall.rank)
            )  # fmt: skip
            rows = session.execute(stmt).all()
            if not rows:
                raise Unprocessable(f"api: {api!r} is in none of project {project!r}'s comparisons")
            every = [
                ApiHistoryPoint(
                    comparison_id=call.comparison_id, created_at=created, target_run=target, target_name=name,
                    bench_run=bench, rank=call.rank, status=call.status, max_rel_err=call.max_rel_err,
                    one_minus_cos=call.one_minus_cos, step=at_step, mode=str((summary or {}).get("mode")),
                )  # fmt: skip
                for call, created, target, bench, name, at_step, summary in rows
            ]
        data = [p for p in every
                if step in (None, p.step) and mode in (None, p.mode) and rank in (None, p.rank)]  # fmt: skip
        series = list(dict.fromkeys(history_series(p) for p in data))
        return ApiHistoryPublic(
            project=project, api=api, data=data, series=series,
            steps=sorted({p.step for p in every if p.step is not None}),
            modes=sorted({str(p.mode) for p in every}),
        )  # fmt: skip

    def environment(self, comparison_id: str) -> EnvironmentDiff:
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            target, bench = session.get(Run, c.target_run_id), session.get(Run, c.bench_run_id)
            return environment_diff(dict(target.meta or {}) if target else {},
                                    dict(bench.meta or {}) if bench else {})  # fmt: skip


#: Dump tasks that compare with each other: equal ones, and a tensor dump with a statistics one (with or
#: without md5 checksums), compared in statistics mode.
_COMPARABLE = frozenset({"tensor", "statistics", "md5"})
_TASK_WORDS = {"md5": "statistics with md5 checksums (summary_mode md5)",
               "statistics": "statistics without md5 checksums"}  # fmt: skip


def task_mismatch(target: str | None, baseline: str | None) -> str | None:
    """Why a run whose dump holds ``target`` cannot be compared with a baseline holding ``baseline``
    (``Run.dump_task``), or None when it can, as the engine's ``detect_mode`` judges with mixed tasks allowed.
    Not known (validated before revision 0015) or ``mixed`` (the worker judges each step): None."""
    if target is None or baseline is None or "mixed" in (target, baseline):
        return None
    pair = {target, baseline}
    if pair <= _COMPARABLE and (target == baseline or "tensor" in pair):
        return None  # a tensor dump against statistics: statistics mode (it records each tensor's too)
    why = ("dump both with the same summary_mode" if pair == {"statistics", "md5"}
           else "dumps of these tasks cannot be compared")  # fmt: skip
    return (f"its dump is {_TASK_WORDS.get(target, f'task {target}')}, the baseline's "
            f"{_TASK_WORDS.get(baseline, f'task {baseline}')}: {why}")  # fmt: skip


def history_series(point: ApiHistoryPoint) -> str:
    """The line a history point belongs to: one per step and mode (a step's error means another thing at
    another step, and a statistics-mode error is not a tensor-mode one)."""
    return f"step {point.step}, {point.mode}"


def api_errors(session: Any, comparison_id: str, apis: set[str]) -> dict[str, float | None]:
    """Each of ``apis``' error in a comparison: the largest max relative error of its calls over the ranks
    (1 - cosine where a mode has no relative error); APIs without calls are left out."""
    if not apis:
        return {}
    c = ComparisonCall
    rows = session.execute(
        select(c.api, func.max(c.max_rel_err), func.max(c.one_minus_cos))
        .where(c.comparison_id == comparison_id, c.api.in_(apis)).group_by(c.api)
    ).all()  # fmt: skip
    return {api: rel if rel is not None else cos for api, rel, cos in rows}


def call_order(session: Any, comparison_id: str, apis: set[str]) -> dict[str, int]:
    """Each of ``apis``' place in execution order in a comparison (its first call's, over the ranks)."""
    if not apis:
        return {}
    c = ComparisonCall
    rows = session.execute(
        select(c.api, func.min(c.seq))
        .where(c.comparison_id == comparison_id, c.api.in_(apis)).group_by(c.api)
    ).all()  # fmt: skip
    return {api: int(seq) for api, seq in rows}


def _acceptance_public(row: ApiAcceptance) -> AcceptancePublic:
    return AcceptancePublic(project=row.project, api=row.api, note=row.note, accepted_by=row.accepted_by,
                            author=row.author, created_at=row.created_at, level=row.level)  # fmt: skip
