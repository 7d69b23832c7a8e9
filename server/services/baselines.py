"""Baselines and regressions: a project's known-good run, the comparison queued against it when a run
completes, failing APIs judged new or known, notes that accept an API, an API's error across comparisons,
and what differs between two runs' environments.

A comparison is *against the baseline* when its bench run was its project's baseline when it was queued
(``Comparison.against_baseline``). Its failing APIs are **known** when they failed in the project's previous
succeeded comparison against the same baseline, or when someone accepted them with a note; the rest are
**new**: the regressions this run brought.
"""

from __future__ import annotations

import logging
from typing import Any

from parity.server.db import Database
from parity.server.errors import Conflict, NotFound
from parity.server.models import ApiAcceptance, Comparison, ComparisonCall, Run, RunTag, utcnow
from parity.server.repositories import RunRepository, serialize_on
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
from parity.server.services.runs import RunService
from sqlalchemy import delete, select, update

logger = logging.getLogger(__name__)

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
            run = RunRepository(session).get(run_id, for_update=True)
            if run is None:
                raise NotFound(f"run {run_id!r} not found")
            if body.name is not None and body.name != run.name:
                # Names are unique in a project (RunService.create): a rename must not bring back the
                # ambiguity that made ``compare-runs NAME`` fail.
                serialize_on(session, f"run-name\0{run.project}\0{body.name}")
                taken = RunRepository(session).named(body.name, run.project)
                if taken:
                    raise Conflict(f"name: project {run.project!r} already has a run named {body.name!r} "
                                   f"({taken[-1].id}); names are unique in a project")  # fmt: skip
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
        the baseline itself, the project has no complete baseline, or the two share no step. Never raises
        for those: completing a run must not fail because its comparison cannot be made."""
        with self.db.read() as session:
            run = session.get(Run, run_id)
            if run is None or not run.auto_compare or run.baseline or run.status != "complete":
                return None
            baseline = session.scalars(
                select(Run).where(Run.project == run.project, Run.baseline.is_(True))
                .where(Run.status == "complete")
            ).first()
            if baseline is None:
                return None
            baseline_id = baseline.id
        try:
            return self.comparisons.create(ComparisonCreate(target_run=run_id, bench_run=baseline_id))
        except Exception as exc:  # noqa: BLE001 - reported in the log, the completion itself stands
            logger.warning("run %s: no comparison against baseline %s: %s", run_id, baseline_id, exc)
            return None

    # -- new or known -----------------------------------------------------------------------------------
    def regressions(self, comparison_id: str) -> RegressionsPublic:
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
            before = set((previous.summary or {}).get("failing_apis", [])) if previous is not None else set()
            accepted = {
                a.api: a
                for a in session.scalars(
                    select(ApiAcceptance)
                    .where(ApiAcceptance.project == project, ApiAcceptance.api.in_(failing))
                )
            }
        verdicts = []
        for api in failing:
            note = accepted.get(api)
            known = api in before or note is not None
            verdicts.append(ApiVerdict(
                api=api, verdict="known" if known else "new", failed_before=api in before,
                note=note.note if note else None, accepted_by=note.accepted_by if note else None,
                author=note.author if note else None,
            ))  # fmt: skip
        new = sum(v.verdict == "new" for v in verdicts)
        return RegressionsPublic(
            against_baseline=bool(c.against_baseline), previous_comparison=previous.id if previous else None,
            data=verdicts, new=new, known=len(verdicts) - new,
        )  # fmt: skip

    def accept(self, project: str, body: AcceptanceCreate, who: str) -> AcceptancePublic:
        """Accept ``body.api`` in ``project`` with a note (again: the note is replaced). ``who`` is the
        authenticated identity and is what ``accepted_by`` records; ``body.author`` is free text kept
        beside it, so no one can accept under another's name."""
        author = body.author.strip() if body.author and body.author.strip() else None
        with self.db.write() as session:
            row = session.get(ApiAcceptance, (project, body.api))
            if row is None:
                row = ApiAcceptance(project=project, api=body.api, note=body.note, accepted_by=who,
                                    author=author, created_at=utcnow())  # fmt: skip
                session.add(row)
            else:
                row.note, row.accepted_by, row.author, row.created_at = body.note, who, author, utcnow()
        return AcceptancePublic(project=project, api=body.api, note=body.note, accepted_by=who, author=author,
                                created_at=row.created_at)  # fmt: skip

    def acceptances(self, project: str) -> AcceptancesPublic:
        with self.db.read() as session:
            rows = session.scalars(
                select(ApiAcceptance).where(ApiAcceptance.project == project).order_by(ApiAcceptance.api)
            ).all()
            data = [AcceptancePublic(project=r.project, api=r.api, note=r.note, accepted_by=r.accepted_by,
                                     author=r.author, created_at=r.created_at) for r in rows]  # fmt: skip
        return AcceptancesPublic(data=data, count=len(data))

    # -- history and environment ------------------------------------------------------------------------
    def api_history(self, project: str, api: str) -> ApiHistoryPublic:
        """``api``'s error in each succeeded comparison of ``project`` (by target run), oldest first."""
        with self.db.read() as session:
            recent = (
                select(Comparison.id)
                .join(Run, Run.id == Comparison.target_run_id)
                .where(Run.project == project, Comparison.status == "succeeded")
                .order_by(Comparison.created_at.desc())
                .limit(HISTORY_LIMIT)
                .scalar_subquery()
            )
            rows = session.execute(
                select(ComparisonCall, Comparison.created_at, Comparison.target_run_id,
                       Comparison.bench_run_id, Run.name)
                .join(Comparison, Comparison.id == ComparisonCall.comparison_id)
                .join(Run, Run.id == Comparison.target_run_id)
                .where(ComparisonCall.api == api, ComparisonCall.comparison_id.in_(recent))
                .order_by(Comparison.created_at, ComparisonCall.rank)
            ).all()  # fmt: skip
            data = [
                ApiHistoryPoint(
                    comparison_id=call.comparison_id, created_at=created, target_run=target, target_name=name,
                    bench_run=bench, rank=call.rank, status=call.status, max_rel_err=call.max_rel_err,
                    one_minus_cos=call.one_minus_cos,
                )  # fmt: skip
                for call, created, target, bench, name in rows
            ]
        return ApiHistoryPublic(project=project, api=api, data=data)

    def environment(self, comparison_id: str) -> EnvironmentDiff:
        with self.db.read() as session:
            c = session.get(Comparison, comparison_id)
            if c is None:
                raise NotFound(f"comparison {comparison_id!r} not found")
            target, bench = session.get(Run, c.target_run_id), session.get(Run, c.bench_run_id)
            return environment_diff(dict(target.meta or {}) if target else {},
                                    dict(bench.meta or {}) if bench else {})  # fmt: skip
