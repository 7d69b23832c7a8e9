"""Dependencies: the services from ``app.state`` and the bearer-token check, as ``Annotated`` aliases."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from parity.server.errors import Forbidden, Unauthorized
from parity.server.security.throttle import GuessThrottle
from parity.server.security.tokens import Token, TokenRegistry
from parity.server.services.baselines import BaselineService
from parity.server.services.calls import CallService
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService

ANONYMOUS = "anonymous"
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
    never block) so that FastAPI does not hop to a worker thread for them on every request. The token's
    identity (name or fingerprint) is left in ``request.state.identity`` for the routes that record who.
    """
    tokens: TokenRegistry = request.app.state.tokens
    request.state.identity = ANONYMOUS
    if not tokens.enabled:
        return
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        raise Unauthorized("Authorization: a 'Bearer TOKEN' header is required")
    # A header is Latin-1 text: as bytes, any byte sequence a client sends is a (wrong) token, never a 500.
    token = await check_token(request, presented.encode("latin-1", "replace"), "REST")
    if token is None:
        raise Unauthorized("Authorization: unknown token")
    request.state.identity = token.identity
    if request.method in WRITE_METHODS and not token.can_write:
        raise Forbidden(f"Authorization: a read-only token cannot {request.method} {request.url.path}")


async def check_token(request: Request, presented: bytes, where: str) -> Token | None:
    """The configured token ``presented`` is, or None after counting and logging the failure and waiting
    the throttle's delay; 429 (``TooManyRequests``) while the client's address is over its limit."""
    throttle: GuessThrottle = request.app.state.throttle
    address = client_address(request)
    throttle.check(address)
    tokens: TokenRegistry = request.app.state.tokens
    token = tokens.match(presented)
    if token is None:
        delay = throttle.failed(address, where)
        if delay > 0:
            await asyncio.sleep(delay)
    return token


def client_address(request: Request) -> str:
    """The client's address as uvicorn reports it (a trusted proxy's ``X-Forwarded-For``)."""
    return request.client.host if request.client else "unknown"


def identity(request: Request) -> str:
    """Who made a request to a route under ``authorize``: a token's name or fingerprint, or anonymous."""
    return str(getattr(request.state, "identity", ANONYMOUS))


RunServiceDep = Annotated[RunService, Depends(get_run_service)]
ComparisonServiceDep = Annotated[ComparisonService, Depends(get_comparison_service)]
BaselineServiceDep = Annotated[BaselineService, Depends(get_baseline_service)]
CallServiceDep = Annotated[CallService, Depends(get_call_service)]
