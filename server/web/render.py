"""Templates (Jinja2, autoescaped) and the headers every page carries.

The Content-Security-Policy allows scripts, styles and images from this server only and no inline script:
even a template bug that forgot to escape a run name could not run it, and nothing is fetched from a CDN.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from parity.server.web.auth import csrf_token, set_csrf_cookie
from parity.shared.numbers import listed, prose_number

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def _number(value: Any) -> str:
    """A metric for a table cell: short, and text kept as it is (``N/A``, ``12.5%``)."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.6g}"
    return str(value)


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _heat(err: float | None) -> str:
    """A heatmap cell's class: the decade of its error, from 1e-6 (cool) to 1 and above (hot)."""
    if err is None or err <= 0:
        return "h0"
    return f"h{min(7, max(1, int(math.log10(err)) + 7))}"


def _asset_versions() -> dict[str, str]:
    """``name -> short content hash`` of each static file: its URL changes when it does, so browsers may keep
    it for a year (``StaticAssets``) and a repeat visit fetches only the page."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in STATIC.iterdir() if p.is_file()}


ASSET_VERSIONS = _asset_versions()


def static_url(name: str) -> str:
    return f"/static/{name}?v={ASSET_VERSIONS.get(name, '0')}"


ENV = Environment(
    loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True, lstrip_blocks=True,
)  # fmt: skip
ENV.filters.update(number=_number, when=_when, size=_size, heat=_heat, prose=prose_number,
                   listed=listed)  # fmt: skip
ENV.globals["static"] = static_url


def render(request: Request, template: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    csrf = csrf_token(request)
    html = ENV.get_template(template).render(request=request, csrf=csrf, **context)
    response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
    set_csrf_cookie(request, response, csrf)
    return response
