"""``create_app(settings)``: the FastAPI app. Nothing is built at import time; the lifespan migrates the
database, opens the store and starts the job queue, and stops the queue at shutdown."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import timedelta

import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from parity.server import web
from parity.server.api.deps import authorize
from parity.server.api.routes import baselines, comparisons, runs
from parity.server.db import Database
from parity.server.disk import STORAGE_FULL_HINT, Reserve, is_storage_full
from parity.server.errors import ServiceError, TooManyRequests
from parity.server.jobs.base import JobQueue, NullQueue
from parity.server.schemas import ErrorPublic, Health
from parity.server.security.headers import NO_FRAMING, SecurityHeaders
from parity.server.security.sessions import SessionStore
from parity.server.security.throttle import GuessThrottle
from parity.server.security.tokens import TokenRegistry, server_key
from parity.server.services.baselines import BaselineService
from parity.server.services.calls import CallService
from parity.server.services.comparisons import ComparisonService
from parity.server.services.retention import RetentionService
from parity.server.services.runs import RunService
from parity.server.settings import Settings
from parity.server.store import open_store
from parity.shared.contract import API_PREFIX
from sqlalchemy.exc import DBAPIError

logger = logging.getLogger(__name__)


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


#: The error answers API routes give, always as {"detail": "one line"}. Declared on every route (a route may
#: not give each of them: 413 and 507 come from writes), so that no answer is undeclared.
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorPublic, "description": description}
    for code, description in {
        400: "A malformed header, path or query value",
        401: "No bearer token, or an unknown one (when the server has tokens)",
        403: "A read-only token used for a write",
        404: "No such run or comparison",
        409: "The request conflicts with the current state (named in the detail)",
        413: "The body exceeds the server's limit",
        422: "A body or query value fails validation (the detail names the field)",
        429: "Too many wrong tokens from this address; Retry-After says in how many seconds to try again",
        507: f"The server's storage is full; {STORAGE_FULL_HINT}",
    }.items()
}


def _error_response(request: Request, exc: Exception) -> JSONResponse:
    """An exception no service turned into a ``ServiceError``: a full disk or database is a 507 saying so
    (one warning line), anything else a bug (the traceback goes to the log, the client gets one line)."""
    logged = f"{request.method} {request.url.path!r}"  # repr: a newline in a path cannot forge a log line
    if is_storage_full(exc):
        logger.warning("%s: storage is full: %r", logged, str(exc))
        detail = f"storage is full ({type(exc).__name__}); {STORAGE_FULL_HINT}"
        return JSONResponse({"detail": detail}, status_code=507)
    logger.error("%s failed", logged, exc_info=exc)
    where = f"{request.method} {request.url.path}"
    return JSONResponse(
        {"detail": f"internal error ({type(exc).__name__}) in {where}; see the server log"}, status_code=500
    )


def _mount_docs(app: FastAPI) -> None:
    """``/docs`` from Swagger UI's files shipped in the ``swagger-ui-bundle`` package: no CDN, so it works on
    a cluster without internet access."""
    from swagger_ui_bundle import swagger_ui_path

    assets = "/docs/assets"
    app.mount(assets, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js", swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png",
        )  # fmt: skip
        # Swagger UI runs inline script, so no script policy here; but no other site may frame it.
        page.headers.update(NO_FRAMING)
        return page


async def _sweep_periodically(retention: RetentionService, interval_s: float) -> None:
    """The retention sweep every ``interval_s`` seconds, in a worker thread; a failed sweep is logged and
    tried again at the next interval (a transient database error must not end the schedule)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await anyio.to_thread.run_sync(retention.sweep)
        except Exception:
            logger.exception("retention sweep failed; next try in %g s", interval_s)


def make_queue(settings: Settings, db: Database) -> JobQueue:
    if settings.job_backend == "celery":
        from parity.server.jobs.celery_app import CeleryQueue

        return CeleryQueue(settings, db)
    if settings.workers <= 0:
        return NullQueue()
    from parity.server.jobs.local import LocalProcessQueue

    return LocalProcessQueue(settings, db)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from parity.server.migrate import upgrade

        data_dir = settings.resolved_data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.resolved_database_url)
        db = Database.connect(settings.resolved_database_url)
        store = open_store(settings.resolved_store_url, data_dir / "tmp")
        # One server per data directory: whatever is in its temp folders now was left by a killed server.
        swept = store.sweep_temp()
        if swept:
            logger.info("removed %d temp file(s) left by the previous server", swept)
        reserve = Reserve(data_dir / "reserve", settings.reserve_bytes)
        reserve.fill()
        queue = make_queue(settings, db)
        app.state.settings = settings
        app.state.tokens = TokenRegistry(settings.token_entries(), server_key(db, settings.session_secret))
        app.state.tokens.warn_short()
        app.state.sessions = SessionStore(db, timedelta(hours=settings.session_hours))
        ended = app.state.sessions.keep_only({t.key for t in app.state.tokens.tokens})
        if ended:
            logger.info("ended %d web session(s) of tokens no longer configured, or expired", ended)
        app.state.throttle = GuessThrottle(settings.auth_failure_limit, settings.auth_failure_window_seconds,
                                           settings.auth_failure_delay_seconds)  # fmt: skip
        app.state.run_service = RunService(db, store, settings.max_upload_bytes, reserve, queue)
        app.state.comparison_service = ComparisonService(
            db, store, queue, task_max_bytes=settings.task_max_bytes
        )
        app.state.baseline_service = BaselineService(db, app.state.run_service, app.state.comparison_service)
        app.state.call_service = CallService(db)
        retention = RetentionService(
            db, store, app.state.run_service, app.state.comparison_service,
            retention_days=settings.retention_days, grace_seconds=settings.temp_grace_seconds,
            reserve=reserve,
        )  # fmt: skip
        queue.start()
        sweeper = asyncio.create_task(_sweep_periodically(retention, settings.sweep_interval_seconds))
        # Everything built so far lives as long as the server: moving it out of the collector's reach keeps
        # full collections (pauses of tens of ms with ~10^6 tracked objects) off the request path.
        gc.collect()
        gc.freeze()
        auth = "on" if app.state.tokens.enabled else "off"
        logger.info("parity server ready: database %s, store %s, %d worker(s), auth %s", db.dialect,
                    store.url, settings.workers, auth)  # fmt: skip
        try:
            yield
        finally:
            sweeper.cancel()
            with suppress(asyncio.CancelledError):
                await sweeper
            queue.stop()
            db.dispose()

    app = FastAPI(
        title="Parity",
        summary="A team history of precision runs, compare jobs and reports.",
        version="1",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        docs_url=None,  # served from packaged files below, not a CDN
        redoc_url=None,
    )
    _mount_docs(app)
    app.add_middleware(SecurityHeaders)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        # Messages quoting a library's error (boto3, a JSON parser) can span lines; the client shows one.
        message = " ".join(exc.message.split("\n"))
        response: Response
        if _is_page(request):
            response = await web.error_page(request, exc.status_code, message)
        else:
            response = JSONResponse({"detail": message}, status_code=exc.status_code)
        if isinstance(exc, TooManyRequests):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    # OSError and database errors are handled here rather than by the catch-all below, which Starlette
    # re-raises after answering (a second traceback in the log per request).
    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(DBAPIError)
    async def _database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        status_code = 400 if first.get("loc", ("",))[0] == "header" else 422
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")  # a validator's own words
        if _is_page(request):
            return await web.error_page(request, status_code, f"{loc}: {msg}")
        return JSONResponse({"detail": f"{loc}: {msg}"}, status_code=status_code)

    @app.get("/healthz", tags=["health"])
    def healthz() -> Health:
        return Health(status="ok")

    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(authorize)], responses=ERROR_RESPONSES)
    api.include_router(runs.router)
    api.include_router(comparisons.router)
    api.include_router(baselines.router)
    app.include_router(api)
    web.mount(app)
    return app


def _is_page(request: Request) -> bool:
    """A request for a web page (not REST, not the pages' own JSON): its errors are shown as a page."""
    path = request.url.path
    return not path.startswith((API_PREFIX, "/healthz", "/static")) and not path.endswith(".json")
