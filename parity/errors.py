"""Which exceptions the command line reports as a one-line error rather than a traceback."""

from __future__ import annotations

import importlib


def user_error_types() -> tuple[type[BaseException], ...]:
    """The base error of each side that is importable here (the client and server may not be installed)."""
    found: list[type[BaseException]] = []
    for module_name, class_name in (
        ("parity.shared.errors", "ParityError"),
        ("parity.client.errors", "ClientError"),
        ("parity.server.errors", "ServiceError"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(getattr(module, class_name))
    return tuple(found)


#: The extra that brings each module a light install (``pip install parity``, the client) may lack; the keys
#: are import names, the values the extras of pyproject.toml that list them.
EXTRA_OF_MODULE: dict[str, str] = {
    "numba": "compare",
    "openpyxl": "compare",
    "xlsxwriter": "compare",
    "rustpy_xlsxwriter": "compare",
    "orjson": "compare",
    "msgspec": "compare",
    "yaml": "compare",
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "sqlalchemy": "server",
    "alembic": "server",
    "pydantic_settings": "server",
    "boto3": "server",
    "swagger_ui_bundle": "server",
    "ijson": "server",
    "cachetools": "server",
    "celery": "celery",
    "redis": "celery",
    "psycopg": "postgres",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """What to install for a module that one of Parity's extras brings; None for any other missing module."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return f"needs the [{extra}] extra, not installed here (no module {top!r}): pip install 'parity[{extra}]'"
