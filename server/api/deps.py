"""Dependencies: the services from ``app.state`` and the bearer-token check, as ``Annotated`` aliases."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from parity.server.errors import Forbidden, Unauthorized
from parity.server.services.baselines import BaselineService
from parity.server.services.calls import CallService
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

#: JSON bodies (a run's tags and metadata, a compare request) are small; only file uploads are big.
JSON_BODY_LIMIT = 1 << 20

#: The largest ``offset`` a list accepts: past 2**63 the databases' integers overflow (a 500 before).
MAX_OFFSET = 2**31 - 1


async def get_run_service(request: Request) -> RunService:
    service: RunService = request.app.state.run_service
    return service


async def get_comparison_service(request: Request) -> ComparisonService:
    service: ComparisonService = request.app.state.comparison_service
    return service


async def get_baseline_service(request: Request) -> BaselineService:
    service: BaselineService = request.app.state.baseline_service
    return service


async def get_call_service(request: Request) -> CallService:
    service: CallService = request.app.state.call_service
    return service


#: Declares the bearer scheme in the OpenAPI schema (so ``/docs`` offers a token field); ``authorize`` reads
#: the header itself, to answer every malformed one with the same one-line 401.
_BEARER = HTTPBearer(auto_error=False, description="a token of PARITY_TOKENS, when the server has any")


async def authorize(
    request: Request, _declared: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)] = None
) -> None:
    """``PARITY_TOKENS`` set: a known bearer token on every request, and a read-write one for writes.

    Runs before any body is read, so a refused upload stores nothing. The dependencies are ``async`` (they
    never block) so that FastAPI does not hop to a worker thread for them on every request.
    """
    roles: dict[str, bool] = request.app.state.token_roles
    if not roles:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Authorization: a 'Bearer TOKEN' header is required")
    # Compared as bytes: ``compare_digest`` refuses str with non-ASCII characters, and a header is
    # Latin-1 text, so any byte sequence a client sends is a (wrong) token rather than a 500.
    presented = token.encode("latin-1", "replace")
    can_write = next(
        (w for known, w in roles.items() if hmac.compare_digest(known.encode("ascii"), presented)), None
    )
    if can_write is None:
        raise Unauthorized("Authorization: unknown token")
    if request.method in WRITE_METHODS and not can_write:
        raise Forbidden(f"Authorization: a read-only token cannot {request.method} {request.url.path}")


RunServiceDep = Annotated[RunService, Depends(get_run_service)]
ComparisonServiceDep = Annotated[ComparisonService, Depends(get_comparison_service)]
BaselineServiceDep = Annotated[BaselineService, Depends(get_baseline_service)]
CallServiceDep = Annotated[CallService, Depends(get_call_service)]
