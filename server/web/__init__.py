"""The team's web pages, served by the API server itself: server-rendered (Jinja2), one small script and
one stylesheet vendored here, no CDN and no Node build. ``mount(app)`` adds them to an app."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from parity.server.web.auth import LoginRequired
from parity.server.web.render import STATIC, render

__all__ = ["mount", "error_page"]


def mount(app: FastAPI) -> None:
    from parity.server.web.routes import router

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(router)

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, _exc: LoginRequired) -> Response:
        if request.url.path.endswith(".json"):
            return Response('{"detail":"sign in first"}', status_code=401, media_type="application/json")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        from urllib.parse import quote

        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    return render(request, "error.html", {"status_code": status_code, "message": message, "user": None},
                  status_code=status_code)  # fmt: skip
