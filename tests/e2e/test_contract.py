"""The REST contract is written once: every JSON body the app reads or writes is a model of
``parity.shared.contract``, the module the client parses its answers with (the client side is tested in
``test_uploader_app.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.server.main import create_app
from parity.server.settings import Settings
from parity.shared import contract

#: FastAPI's own error bodies, which the app replaces by ``{"detail": "..."}`` anyway.
FASTAPI_ERRORS = {"HTTPValidationError", "ValidationError"}


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def test_every_body_of_every_route_is_a_contract_model(tmp_path: Path) -> None:
    schema = create_app(Settings(data_dir=tmp_path, workers=0)).openapi()
    used = {
        f"{method.upper()} {path}": _refs([op.get("requestBody"), op["responses"]]) - FASTAPI_ERRORS
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    # Every API route declares its error answers as the contract's ErrorPublic ({"detail": "one line"}).
    assert used["POST /api/v1/runs"] == {"RunCreate", "RunPublic", "ErrorPublic"}
    assert used["GET /api/v1/comparisons/{comparison_id}/rows"] == {"RowsPublic", "ErrorPublic"}
    for route, models in used.items():
        for name in models:
            assert name in contract.__all__, f"{route}: {name} is not a model of parity.shared.contract"
    components = set(schema["components"]["schemas"]) - FASTAPI_ERRORS
    assert components <= set(contract.__all__), components - set(contract.__all__)
