"""The team's web pages, served by the API server itself: server-rendered (Jinja2), one small script and
one stylesheet vendored here, no CDN and no Node build. ``mount(app)`` adds them to an app."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from parity.server.web.auth import LoginRequired
from parity.server.web.render import STATIC, render
from starlette.types import Scope

__all__ = ["mount", "error_page"]


class StaticAssets(StaticFiles):
    """The vendored stylesheet and script; their URLs carry a content hash, so they are cached for good."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
            response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def mount(app: FastAPI) -> None:
    from parity.server.web.routes import router

    app.mount("/static", StaticAssets(directory=STATIC), name="static")
    app.include_router(router)

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, _exc: LoginRequired) -> Response:
        if request.url.path.endswith(".json"):
            return Response('{"detail":"sign in first"}', status_code=401, media_type="application/json")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        from urllib.parse import quote

        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


async def error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    """The error page, with the header of the person signed in (sign-out and all), as every page has it;
    none for someone not signed in (or when the session cannot be read: the error is what to show)."""
    from parity.server.web.auth import current_user
    from starlette.concurrency import run_in_threadpool

    try:
        user = await run_in_threadpool(current_user, request)
    except Exception:  # noqa: BLE001 - signed out, or the database is what failed: no header, the error stands
        user = None
    return render(request, "error.html", {"status_code": status_code, "message": message, "user": user},
                  status_code=status_code)  # fmt: skip
