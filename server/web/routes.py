"""The pages: ``/`` (runs), ``/runs/{id}``, ``/comparisons/{id}``, ``/apis/history``, sign-in, and the few
JSON and download endpoints the pages' own script and links use (cookie-authenticated, unlike ``/api/v1``).

Every page is rendered on the server from the same services the REST routes call; filters and paging live in
the query string, so a view can be shared by its URL. Writes are plain HTML form posts (CSRF-checked) that
redirect back to the page (post/redirect/get).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, get_args
from urllib.parse import parse_qsl, urlencode

import orjson
import parity.server.api.convertors  # noqa: F401 - registers {run_id:ref}
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse
from parity.server.api.deps import (
    BaselineServiceDep,
    CallServiceDep,
    ComparisonServiceDep,
    RunServiceDep,
    check_token,
)
from parity.server.errors import BadRequest, PayloadTooLarge, ServiceError
from parity.server.schemas import (
    AcceptanceCreate,
    ComparisonCreate,
    ComparisonPublic,
    Device,
    RunStatus,
    RunUpdate,
)
from parity.server.security.sessions import SessionStore
from parity.server.services.baselines import history_series, task_mismatch
from parity.server.services.comparisons import RowFilter
from parity.server.services.plans import plan_chain
from parity.server.web.auth import (
    SESSION_COOKIE,
    WebUser,
    check_form,
    clear_session,
    current_user,
    require_writer,
    start_session,
)
from parity.server.web.columns import page_order
from parity.server.web.render import render
from parity.shared.contract import split_tag
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

router = APIRouter(include_in_schema=False)

UserDep = Annotated[WebUser, Depends(current_user)]
RUNS_PER_PAGE = 50
#: Comparisons of a run page judged new/worse/known (one ``regressions`` each; the others show their status).
RUN_VERDICTS = 20
ROWS_PER_PAGE = 100
#: Calls drawn at most: about four per horizontal pixel of the chart (``calls.decimate`` keeps the spikes).
CHART_POINTS = 4000
FORM_LIMIT = 64 * 1024
ROW_STATUSES = ("pass", "warning", "fail", "unmatched", "bench-only", "uncomparable")
#: The verdicts "what changed since the previous comparison" lists; new and worse are marked on the chart.
CHANGED = ("new", "worse", "fixed")
MARKED = ("new", "worse")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body (no multipart: the pages post only short text), CSRF-checked. The handlers
    that post are ``async`` to read it; the service calls after it go to the threadpool (they block)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            raise PayloadTooLarge(f"form body over {FORM_LIMIT} bytes")
    form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    check_form(request, form)
    return form


def back(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def query_url(path: str, params: dict[str, Any], **changes: Any) -> str:
    """``path`` with ``params`` updated by ``changes``; empty values are dropped, so URLs stay short."""
    merged = {**params, **changes}
    items = [(k, v) for k, v in merged.items() if v not in (None, "", False)]
    return f"{path}?{urlencode(items)}" if items else path


# -- sign-in --------------------------------------------------------------------------------------------
@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:  # noqa: A002 - the usual name
    return render(request, "login.html", {"next": _safe_next(next), "error": None, "user": None})


@router.post("/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    token = form.get("token", "").strip()
    target = _safe_next(form.get("next", "/"))
    if not request.app.state.tokens.enabled:
        return back(target)
    # The form's text as UTF-8 bytes: a non-ASCII or huge token is a wrong one, compared as REST compares.
    found = await check_token(request, token.encode("utf-8"), "web") if token else None
    if found is None:
        return render(request, "login.html", {"next": target, "error": "Unknown token.", "user": None},
                      status_code=401)  # fmt: skip
    sessions: SessionStore = request.app.state.sessions
    previous = request.cookies.get(SESSION_COOKIE)
    if previous:
        await run_in_threadpool(sessions.end, previous)
    session_id = await run_in_threadpool(sessions.create, found.key, found.can_write)
    response = back(target)
    start_session(request, response, session_id)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End this session (``everywhere=1``: every session of its token) and clear the cookie."""
    form = await read_form(request)
    sessions: SessionStore = request.app.state.sessions
    session_id = request.cookies.get(SESSION_COOKIE, "")
    if session_id:
        info = await run_in_threadpool(sessions.get, session_id)
        if info is not None and form.get("everywhere") == "1":
            await run_in_threadpool(sessions.end_all_of, info.token_key)
        else:
            await run_in_threadpool(sessions.end, session_id)
    response = back("/login")
    clear_session(request, response)
    return response


def _safe_next(target: str) -> str:
    """Only a path on this site: ``//evil.example`` or ``https://...`` would make sign-in an open redirect."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


# -- runs -----------------------------------------------------------------------------------------------
@router.get("/")
def runs_page(
    request: Request,
    user: UserDep,
    runs: RunServiceDep,
    baselines: BaselineServiceDep,
    project: str = "",
    name: str = "",
    device: str = "",
    tag: str = "",
    status: str = "",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> Response:
    # Plain strings, not enums: a filter form submits its empty fields too ("any").
    _one_of("device", device, get_args(Device))
    _one_of("status", status, get_args(RunStatus))
    params = {"project": project, "name": name, "device": device, "tag": tag, "status": status}
    result = runs.search(
        project=project or None, name=None, name_contains=name or None, device=device or None,
        status=status or None, tags=tag_filters(tag), limit=RUNS_PER_PAGE,
        offset=(page - 1) * RUNS_PER_PAGE,
    )  # fmt: skip
    pages = max(1, math.ceil(result.count / RUNS_PER_PAGE))
    return render(request, "runs.html", {
        "user": user, "runs": baselines.with_verdicts(result.data), "count": result.count, "params": params,
        "page": page,
        "pages": pages, "url": lambda **kw: query_url("/", params, **kw),
    })  # fmt: skip


def tag_filters(text: str) -> list[str]:
    """The tag filter's ``KEY=VALUE`` items (comma-separated), checked here so that a mistyped one is the
    filter form's 400 naming the item and the form, never a bare query error."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    for item in items:
        if "=" not in item:
            raise BadRequest(f"tag: {item!r} is not KEY=VALUE (as the runs list shows tags, e.g. hw=gpu)")
    return items


def _one_of(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value and value not in allowed:
        raise BadRequest(f"{field}: {value!r} is not one of {', '.join(allowed)}")


def _int_or_none(field: str, value: str) -> int | None:
    try:
        return int(value) if value.strip() else None
    except ValueError:
        raise BadRequest(f"{field}: {value!r} is not a number") from None


@router.get("/runs/{run_id:ref}")
def run_page(
    request: Request, run_id: str, user: UserDep, runs: RunServiceDep, comparisons: ComparisonServiceDep,
    baselines: BaselineServiceDep,
) -> Response:  # fmt: skip
    run = runs.get(run_id)
    files = runs.files(run_id)
    related = comparisons.search(run=run_id, project=None, status=None, limit=100, offset=0)
    names = _run_names(runs, {r for c in related.data for r in (c.target_run, c.bench_run)})
    baseline = baselines.baseline_of(run.project)
    (run,) = baselines.with_verdicts([run])
    # The comparison against the baseline first (the newest), then the others, newest first.
    ordered = sorted(related.data, key=lambda c: c.created_at, reverse=True)
    ordered.sort(key=lambda c: not (c.against_baseline and c.target_run == run.id))
    verdicts = {c.id: baselines.regressions(c.id) for c in ordered[:RUN_VERDICTS]
                if c.status == "succeeded" and c.against_baseline}  # fmt: skip
    against = run.verdict.comparison if run.verdict is not None else None
    changed = [v for v in verdicts[against].data if v.verdict in CHANGED] if against in verdicts else []
    return render(request, "run.html", {
        "user": user, "run": run, "files": files.data[:200], "file_count": files.count,
        "comparisons": ordered, "comparison_count": related.count, "names": names, "verdicts": verdicts,
        "changed": changed,
        "baseline": baseline, "baseline_unfit": _unfit_baseline(run, baseline),
        "chain": plan_chain(comparisons, runs, run_id=run.id),
    })  # fmt: skip


def _unfit_baseline(run: Any, baseline: Any) -> str | None:
    """Why the project's baseline cannot be compared with ``run`` (the compare form is then left empty), or
    None when it can: a baseline that is the run itself, not complete, shares no step with it, or holds a
    dump task it cannot be compared with (``baselines.task_mismatch``)."""
    if baseline is None or baseline.id == run.id:
        return "it is the baseline itself" if baseline is not None else None
    if baseline.status != "complete":
        return f"baseline {baseline.name} is {baseline.status}"
    if run.steps and baseline.steps and not set(run.steps) & set(baseline.steps):
        return f"baseline {baseline.name} has steps {baseline.steps}, this run {run.steps}: none in both"
    mismatch = task_mismatch(run.dump_task, baseline.dump_task)
    return f"baseline {baseline.name}: {mismatch}" if mismatch else None


def _run_names(runs: Any, ids: set[str]) -> dict[str, str]:
    out = {}
    for run_id in ids:
        try:
            out[run_id] = runs.get(run_id).name
        except ServiceError:
            out[run_id] = run_id
    return out


@router.post("/runs/{run_id}/edit")
async def edit_run(request: Request, run_id: str, user: UserDep, baselines: BaselineServiceDep) -> Response:
    form = await read_form(request)
    require_writer(user, "edit a run")
    changes: dict[str, Any] = {}
    if "name" in form:
        changes["name"] = form["name"].strip()
    if "tags" in form:
        changes["tags"] = _parse_tags(form["tags"])
    if "baseline" in form:
        changes["baseline"] = form["baseline"] == "1"
    try:
        body = RunUpdate(**changes)
    except ValidationError as exc:
        raise BadRequest(f"run {run_id}: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
    await run_in_threadpool(baselines.update_run, run_id, body)
    return back(f"/runs/{run_id}")


def _parse_tags(text: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            key, value = split_tag(item)
        except ValueError:
            raise BadRequest(f"tags: {item!r} is not KEY=VALUE") from None
        tags[key] = value
    return tags


@router.post("/runs/{run_id}/compare")
async def compare_run(
    request: Request, run_id: str, user: UserDep, comparisons: ComparisonServiceDep
) -> Response:
    form = await read_form(request)
    require_writer(user, "queue a comparison")
    bench = form.get("bench_run", "").strip()
    if not bench:
        raise BadRequest("bench_run: give the id of the run to compare with")
    body = ComparisonCreate(target_run=run_id, bench_run=bench)
    created = await run_in_threadpool(comparisons.create, body)
    return back(f"/comparisons/{created.id}")


# -- comparisons ----------------------------------------------------------------------------------------
@router.get("/comparisons/{comparison_id}")
def comparison_page(
    request: Request,
    comparison_id: str,
    user: UserDep,
    runs: RunServiceDep,
    comparisons: ComparisonServiceDep,
    calls: CallServiceDep,
    baselines: BaselineServiceDep,
    status: str = "",
    name: str = "",
    rank_text: Annotated[str, Query(alias="rank")] = "",
    diff_text: Annotated[str, Query(alias="diff")] = "",
    page: Annotated[int, Query(ge=1, le=10_000_000)] = 1,
) -> Response:
    rank = _int_or_none("rank", rank_text)
    diff = diff_text.lower() in ("1", "true", "on", "yes")
    c = comparisons.get(comparison_id)
    params = {"status": status, "name": name, "rank": rank, "diff": diff}
    context: dict[str, Any] = {
        "user": user, "c": c, "params": params, "page": page, "pages": 1, "rows": [], "header": [],
        "row_count": 0, "counts": None, "heatmap": None, "regressions": None, "environment": None,
        "changed": [],
        "statuses": ROW_STATUSES,
        "url": lambda **kw: query_url(f"/comparisons/{comparison_id}", params, **kw),
        "target": _run_or_none(runs, c.target_run), "bench": _run_or_none(runs, c.bench_run),
        "rank_progress": _rank_progress(c), "replays": {},
        "chain": plan_chain(comparisons, runs, comparison_id=comparison_id),
    }  # fmt: skip
    _one_of("status", status, ROW_STATUSES)
    context["environment"] = baselines.environment(comparison_id)
    if c.status == "succeeded" and c.summary is not None:
        ranks = c.summary.ranks
        if rank is not None and rank not in ranks:
            raise BadRequest(f"rank: {rank} is not in comparison {comparison_id} (ranks: {ranks})")
        # A plain (threadpool) handler: every read below blocks, and none may hold up the event loop.
        row_filter = RowFilter.parse(failing=True if diff else None, status=[status] if status else [],
                                     name=name or None)  # fmt: skip
        body = comparisons.rows_json(
            comparison_id, row_filter, rank=rank, limit=ROWS_PER_PAGE, offset=(page - 1) * ROWS_PER_PAGE
        )
        rows = orjson.loads(body)
        order = page_order(rows["header"])
        for row in rows["data"]:
            cells = row["cells"]
            row["cells"] = [cells[i] if i < len(cells) else None for i in order]
        regressions = baselines.regressions(comparison_id)
        context.update(
            rows=rows["data"], header=[rows["header"][i] for i in order], row_count=rows["count"],
            pages=max(1, math.ceil(rows["count"] / ROWS_PER_PAGE)), counts=calls.counts(comparison_id),
            heatmap=calls.heatmap(comparison_id), regressions=regressions,
            changed=[v for v in regressions.data if v.verdict in CHANGED],
            chart_rank=rank if rank is not None else (ranks[0] if ranks else 0), ranks=ranks,
            replays={f"{v.compare_rank}:{v.entry}": v for v in c.summary.replay},
        )  # fmt: skip
    return render(request, "comparison.html", context)


def _run_or_none(runs: Any, run_id: str) -> Any:
    try:
        return runs.get(run_id)
    except ServiceError:
        return None


def _rank_progress(c: ComparisonPublic) -> dict[str, float]:
    """Per-rank progress where the comparison reports it (one task per rank, each with its ``progress``),
    else none: the page then shows the comparison's overall progress only."""
    tasks = getattr(c, "tasks", None) or []
    shares: dict[str, list[float]] = {}
    for t in tasks:
        if hasattr(t, "rank") and hasattr(t, "progress"):  # a rank split in slices: the mean of its slices
            shares.setdefault(str(t.rank), []).append(float(t.progress))
    return {rank: sum(p) / len(p) for rank, p in shares.items()}


@router.get("/comparisons/{comparison_id}/status.json")
def comparison_status(comparison_id: str, user: UserDep, comparisons: ComparisonServiceDep) -> Response:
    c = comparisons.get(comparison_id)
    body = {"status": c.status, "progress": c.progress, "error": c.error, "rank_progress": _rank_progress(c)}
    return Response(orjson.dumps(body), media_type="application/json")


@router.get("/comparisons/{comparison_id}/calls.json")
def comparison_calls(
    comparison_id: str, user: UserDep, comparisons: ComparisonServiceDep, calls: CallServiceDep,
    baselines: BaselineServiceDep, rank: int = 0,
) -> Response:  # fmt: skip
    from parity.server.services.calls import first_divergence

    c = comparisons.get(comparison_id)
    first = first_divergence(c.summary.model_dump() if c.summary else None, rank)
    if c.status != "succeeded":
        return Response(b'{"total":0,"api":[]}', media_type="application/json")
    # Not cached with the calls: an acceptance given or revoked since changes what is marked.
    marks = {v.api: v.verdict for v in baselines.regressions(comparison_id).data if v.verdict in MARKED} \
        if c.against_baseline else {}  # fmt: skip
    key = ("chart", comparison_id, rank, tuple(sorted(marks.items())))
    body = calls.cached(key, lambda: _chart_json(calls, comparison_id, rank, first, marks))
    return Response(body, media_type="application/json")


def _chart_json(calls: Any, comparison_id: str, rank: int, first: str | None, marks: dict[str, str]) -> bytes:
    from parity.server.services.calls import decimate

    every = calls.calls(comparison_id, rank)
    data = decimate(every, CHART_POINTS, first)
    if marks and len(data) < len(every):  # the marked calls are drawn, whatever the decimation dropped
        kept = {d["seq"] for d in data}
        data = sorted([*data, *(d for d in every if d["api"] in marks and d["seq"] not in kept)],
                      key=lambda d: d["seq"])  # fmt: skip
    # Columns, not objects: smaller, and faster to parse.
    body = {
        "total": len(every), "seq": [d["seq"] for d in data],
        "api": [d["api"] for d in data], "backward": [d["backward"] for d in data],
        "status": [d["status"] for d in data], "rel": [d["max_rel_err"] for d in data],
        "cos": [d["one_minus_cos"] for d in data], "row": [d["first_row"] for d in data],
        "first_divergence": first, "marks": marks,
    }  # fmt: skip
    return orjson.dumps(body)


@router.get("/comparisons/{comparison_id}/download/{file_name}")
def download(
    comparison_id: str, file_name: str, user: UserDep, comparisons: ComparisonServiceDep,
    rank: int | None = None,
) -> Response:  # fmt: skip
    if file_name == "summary.json":
        c = comparisons.get(comparison_id)
        return Response(c.model_dump_json(indent=2), media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="summary_{comparison_id[:8]}.json"'})  # fmt: skip
    media = {"report.xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
             "advisor.txt": "text/plain; charset=utf-8"}  # fmt: skip
    if file_name not in media:
        raise BadRequest(f"{file_name}: downloads are report.xlsx, advisor.txt and summary.json")
    name, chunks = comparisons.report(comparison_id, file_name, rank)
    return StreamingResponse(chunks, media_type=media[file_name],
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})  # fmt: skip


@router.post("/comparisons/{comparison_id}/accept")
async def accept_api(
    request: Request, comparison_id: str, user: UserDep, comparisons: ComparisonServiceDep,
    runs: RunServiceDep, baselines: BaselineServiceDep,
) -> Response:  # fmt: skip
    form = await read_form(request)
    require_writer(user, "accept an API")
    try:
        body = AcceptanceCreate(api=form.get("api", ""), note=form.get("note", "").strip(),
                                author=form.get("author") or None)  # fmt: skip
    except ValidationError as exc:
        raise BadRequest(f"accept: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None

    def accept() -> None:
        project = runs.get(comparisons.get(comparison_id).target_run).project
        baselines.accept(project, body, user.who)

    await run_in_threadpool(accept)
    return back(f"/comparisons/{comparison_id}#regressions")


@router.post("/comparisons/{comparison_id}/revoke")
async def revoke_api(
    request: Request, comparison_id: str, user: UserDep, comparisons: ComparisonServiceDep,
    runs: RunServiceDep, baselines: BaselineServiceDep,
) -> Response:  # fmt: skip
    """Withdraw an API's acceptance from the comparison page (``DELETE .../acceptances/{api}`` over REST)."""
    form = await read_form(request)
    require_writer(user, "revoke an acceptance")
    api = form.get("api", "")
    if not api:
        raise BadRequest("revoke: api: give the API whose acceptance to revoke")

    def revoke() -> None:
        baselines.revoke(runs.get(comparisons.get(comparison_id).target_run).project, api)

    await run_in_threadpool(revoke)
    return back(f"/comparisons/{comparison_id}#regressions")


@router.get("/apis/history")
def api_history_page(
    request: Request, user: UserDep, baselines: BaselineServiceDep,
    project: Annotated[str, Query(min_length=1)], api: Annotated[str, Query(min_length=1)],
    step_text: Annotated[str, Query(alias="step")] = "", mode: str = "",
) -> Response:  # fmt: skip
    """One line per step and mode against time; ``step`` and ``mode`` keep one of them."""
    step = _int_or_none("step", step_text)
    history = baselines.api_history(project, api, step=step, mode=mode or None)
    lines: dict[str, list[list[Any]]] = {}
    for p in history.data:  # the chart's series: [time in ms, error] per point, one list per line
        error = p.max_rel_err if p.max_rel_err is not None else p.one_minus_cos
        lines.setdefault(history_series(p), []).append([int(p.created_at.timestamp() * 1000), error])
    params = {"project": project, "api": api, "step": step, "mode": mode}
    return render(request, "history.html", {
        "user": user, "history": history, "params": params, "lines": lines,
        "series_of": history_series, "url": lambda **kw: query_url("/apis/history", params, **kw),
    })  # fmt: skip
