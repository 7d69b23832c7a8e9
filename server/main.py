"""``create_app(settings)``: the FastAPI app. Nothing is built at import time; the lifespan migrates the
database, opens the store and starts the job queue, and stops the queue at shutdown."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from parity.server.api.deps import authorize
from parity.server.api.routes import comparisons, runs
from parity.server.db import Database
from parity.server.errors import ServiceError
from parity.server.jobs.base import JobQueue, NullQueue
from parity.server.schemas import Health
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService
from parity.server.settings import Settings
from parity.server.store import open_store
from parity.shared.contract import API_PREFIX

logger = logging.getLogger(__name__)


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


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
        queue = make_queue(settings, db)
        app.state.settings = settings
        app.state.token_roles = settings.token_roles()
        app.state.run_service = RunService(db, store, settings.max_upload_bytes)
        app.state.comparison_service = ComparisonService(db, store, queue)
        queue.start()
        # Everything built so far lives as long as the server: moving it out of the collector's reach keeps
        # full collections (pauses of tens of ms with ~10^6 tracked objects) off the request path.
        gc.collect()
        gc.freeze()
        auth = "on" if app.state.token_roles else "off"
        logger.info("parity server ready: database %s, store %s, %d worker(s), auth %s", db.dialect,
                    store.url, settings.workers, auth)  # fmt: skip
        try:
            yield
        finally:
            queue.stop()
            db.dispose()

    app = FastAPI(
        title="Parity",
        summary="A team history of precision runs, compare jobs and reports.",
        version="1",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
    )

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        # Messages quoting a library's error (boto3, a JSON parser) can span lines; the client shows one.
        return JSONResponse({"detail": " ".join(exc.message.split("\n"))}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug: the traceback goes to the log, the client gets a one-line JSON detail rather than
        # Starlette's plain-text page.
        logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        where = f"{request.method} {request.url.path}"
        detail = f"internal error ({type(exc).__name__}) in {where}; see the server log"
        return JSONResponse({"detail": detail}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        status_code = 400 if first.get("loc", ("",))[0] == "header" else 422
        return JSONResponse({"detail": f"{loc}: {first.get('msg', 'invalid')}"}, status_code=status_code)

    @app.get("/healthz", tags=["health"])
    def healthz() -> Health:
        return Health(status="ok")

    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(authorize)])
    api.include_router(runs.router)
    api.include_router(comparisons.router)
    app.include_router(api)
    return app
