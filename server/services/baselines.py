"""Baselines and regressions: a project's known-good run, the comparison queued against it when a run
completes, failing APIs judged new or known, notes that accept an API, an API's error across comparisons,
and what differs between two runs' environments.

A comparison is *against the baseline* when its bench run was its project's baseline when it was queued
(``Comparison.against_baseline``). Each of its failing APIs is judged against the project's previous
succeeded comparison against the same baseline and the notes that accepted it (``regressions``):

* **new**: it passed before (or there was no comparison before) and was not accepted;
* **worse**: it failed before or was accepted, and its error grew beyond :data:`WORSE_FACTOR` times the
  level it had when accepted, or (not accepted) the error before: a regression hiding behind a known failure;
* **known**: it failed before or was accepted, and its error did not grow beyond that;

and an API that failed before and passes now is **fixed**. An API's error is the largest max relative error
of its calls over the compared ranks (the ``comparison_calls`` the chart reads).
"""

from __future__ import annotations

import logging
from typing import Any

from parity.server.db import Database
from parity.server.errors import NotFound, Unprocessable
from parity.server.models import ApiAcceptance, Comparison, ComparisonCall, Run, RunTag, utcnow
from parity.server.repositories import RunRepository
from parity.server.schemas import (
    AcceptanceCreate,
    AcceptancePublic,
    AcceptancesPublic,
    ApiHistoryPoint,
    ApiHistoryPublic,
    ApiVerdict,
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
from parity.shared.numbers import prose_number
from sqlalchemy import delete, func, select, update

logger = logging.getLogger(__name__)

#: Comparisons an API's history reaches back over (newest first), enough for months of nightly runs.
HISTORY_LIMIT = 500

#: An API failing before (or accepted) is ``worse`` once its error exceeds this many times the error of the
#: previous comparison against the same baseline, or the level it had when accepted. Nightly drift under a
#: changed dtype moves errors by well under 2x between runs; a real regression moves them by 10x and more.
WORSE_FACTOR = 3.0

#: The order verdicts are listed in: what changed for the worse first.
_VERDICT_ORDER = {"new": 0, "worse": 0, "known": 1, "fixed": 2}


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
        """Each failing API of the comparison judged new, worse or known, and the APIs it fixed; new and
        worse first, in execution order (see the module's docstring)."""
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            failing = list((c.summary or {}).get("failing_apis", []))
            project = session.scalar(select(Run.project).where(Run.id == c.target_run_id)) or ""
            previous = None
            if c.against_baseline:
                previous = session.scalars(
                    select(Comparison)
                    .join(Run, Run.id == Comparison.target_run_id)
                    .where(
                        Run.project == project, Comparison.bench_run_id == c.bench_run_id,
                        Comparison.against_baseline.is_(True), Comparison.status == "succeeded",
                        Comparison.created_at < c.created_at, Comparison.id != c.id,
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
        failed_before = set(before_failing)
        verdicts = [judge(api, now.get(api), then.get(api), api in failed_before, accepted.get(api))
                    for api in failing]  # fmt: skip
        failing_now = set(failing)
        verdicts += [judge(api, now.get(api), then.get(api), True, None, fixed=True)
                     for api in before_failing if api not in failing_now]  # fmt: skip
        verdicts.sort(key=_listing_order)
        count = {v: sum(x.verdict == v for x in verdicts) for v in ("new", "worse", "known", "fixed")}
        return RegressionsPublic(
            against_baseline=bool(c.against_baseline), previous_comparison=previous.id if previous else None,
            data=verdicts, worse_factor=WORSE_FACTOR, **count,
        )  # fmt: skip

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


def judge(api: str, after: float | None, before: float | None, failed_before: bool,
          note: ApiAcceptance | None, *, fixed: bool = False) -> ApiVerdict:  # fmt: skip
    """One API's verdict (see the module's docstring), with the reason in words."""
    level = note.level if note is not None else None
    # An acceptance accepts a level: judged against it (the error may have grown since the previous
    # comparison, which is what was accepted); otherwise against the previous comparison.
    reference, what = (level, "the level accepted") if level is not None else \
        (before if failed_before else None, "the previous comparison")  # fmt: skip
    growth, against = None, ""
    if after is not None and reference is not None and reference > 0:
        growth, against = after / reference, f"{prose_number(reference)} of {what}"
    if fixed:
        verdict = "fixed"
        reason = f"passing now ({_err(after)}), failing in the previous comparison ({_err(before)})"
    elif not failed_before and note is None:
        verdict = "new"
        growth = after / before if after is not None and before else None
        reason = (f"failing now ({_err(after)}), passing in the previous comparison ({_err(before)})"
                  if before is not None else f"failing ({_err(after)}); no earlier comparison had it failing")
    elif growth is not None and growth > WORSE_FACTOR:
        verdict = "worse"
        reason = (f"{_err(after)}, {prose_number(growth)}x the {against} "
                  f"(worse beyond {prose_number(WORSE_FACTOR)}x)")  # fmt: skip
    else:
        verdict = "known"
        if level is not None:
            reason = f"accepted with a note at {_err(level)}; {_err(after)} now"
        elif failed_before:
            reason = f"failing in the previous comparison too ({_err(before)} then, {_err(after)} now)"
        else:
            reason = f"accepted with a note; {_err(after)} now"
    return ApiVerdict(
        api=api, verdict=verdict, failed_before=failed_before, before=before, after=after, growth=growth,  # type: ignore[arg-type]
        accepted_level=level, reason=reason, note=note.note if note else None,
        accepted_by=note.accepted_by if note else None, author=note.author if note else None,
    )  # fmt: skip


def _err(value: float | None) -> str:
    return "error unknown" if value is None else f"max relative error {prose_number(value)}"


def _listing_order(v: ApiVerdict) -> int:
    """New and worse first, then known, then fixed; within each, execution order (the first call that got
    worse is where a regression starts, the calls after it carry it on)."""
    return _VERDICT_ORDER[v.verdict]


def _acceptance_public(row: ApiAcceptance) -> AcceptancePublic:
    return AcceptancePublic(project=row.project, api=row.api, note=row.note, accepted_by=row.accepted_by,
                            author=row.author, created_at=row.created_at, level=row.level)  # fmt: skip
