"""Headers on every answer the server gives: nothing it sends is stored by a cache or a browser's history, nor
sniffed into another type. A pure ASGI middleware (not ``BaseHTTPMiddleware``): it only adds two headers to
the response's start and leaves streamed bodies alone.

The pages set their own, stricter set (``web/render.py``); ``/static`` and Swagger UI's files are the
exceptions to ``no-store``: they hold no data and are cached on purpose.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: For pages that cannot carry the pages' full policy (``/docs`` runs inline script): no framing at least.
NO_FRAMING = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY"}
CACHEABLE_PREFIXES = ("/static/", "/docs/assets/")


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cacheable = str(scope.get("path", "")).startswith(CACHEABLE_PREFIXES)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if not cacheable:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)
