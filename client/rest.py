"""A small typed client for the Parity server's REST API (``/api/v1``), over an injected ``httpx.Client``.

Requests are built and answers parsed with the models of :mod:`parity.shared.contract`, the ones the server
uses: there is no second copy of the contract to drift. An answer outside the contract is an
:class:`ApiError` naming the field, not a ``KeyError`` three calls later.

The transport is injected so that tests can hand in an ``httpx.Client(transport=httpx.MockTransport(...))``
or FastAPI's ``TestClient`` and run without a network; by default a plain ``httpx.Client`` is made. Every
failure becomes an :class:`ApiError` (the server answered with an error status) or a
:class:`ServerUnreachable` (no answer at all), both :class:`~parity.client.errors.UploadError`, with a
one-line message naming the request and the server's ``detail``. :attr:`ApiError.retryable` tells the
uploader whether trying again can help (5xx, 429) or not (any other 4xx).

Example::

    with ParityClient("http://127.0.0.1:8000", token="t0k") as api:
        run = api.create_run("resnet-npu", device="npu")
        api.upload_file(run.id, "step0/rank0/dump.json", Path("dump/step0/rank0/dump.json"))
        api.complete_run(run.id)
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import pydantic
from parity.client.errors import UploadError
from parity.client.server_address import base_url, clean_token, unreachable_hint
from parity.shared.contract import (
    API_PREFIX,
    AcceptanceCreate,
    AcceptancePublic,
    AcceptancesPublic,
    ComparisonCreate,
    ComparisonOptions,
    ComparisonPublic,
    ComparisonsPublic,
    FilePublic,
    FilesPublic,
    Health,
    PlanPublic,
    RegressionsPublic,
    RowsPublic,
    RunCreate,
    RunPublic,
    RunsPublic,
    RunUpdate,
)

__all__ = [
    "API_PREFIX",
    "ApiError",
    "ParityClient",
    "ServerUnreachable",
    "sha256_file",
]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=pydantic.BaseModel)

#: Bytes read per chunk when hashing or streaming a file: big enough that per-chunk overhead is negligible,
#: small enough that an upload never holds more than this of a file in memory.
CHUNK_BYTES = 1 << 20
#: a plan (a config.json whose list has at most ``MAX_PATTERNS`` names) is far smaller; a bigger answer is
#: refused before the training process holds it
MAX_PLAN_BYTES = 16 << 20
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class ApiError(UploadError):
    """The server answered a request with an error status; ``detail`` is its one-line explanation."""

    def __init__(self, method: str, url: str, status_code: int, detail: str) -> None:
        self.method = method
        self.url = url
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"{method} {url}: HTTP {status_code}: {detail}")

    @property
    def retryable(self) -> bool:
        """A server-side or overload failure that may pass on a later try; other 4xx never will."""
        return self.status_code >= 500 or self.status_code in (408, 429)


class ServerUnreachable(UploadError):
    """No answer from the server (refused, reset, timed out): always worth retrying later."""

    retryable = True


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in chunks so that a big tensor file is never held in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _iter_file(path: Path) -> Iterator[bytes]:
    """The request body of an upload: the file in chunks, opened only when httpx starts sending."""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


def _detail(response: httpx.Response) -> str:
    """The server's ``detail`` as one line (FastAPI's validation errors come as a list of dicts)."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip().replace("\n", " ")
        return text[:300] or response.reason_phrase
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", ()))
                parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail).replace("\n", " ")


def _first_error(exc: pydantic.ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message``."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    message = err["msg"].removeprefix("Value error, ")  # a validator's own words (parity.shared.naming)
    return f"{loc or 'body'}: {message}{more}"


def _read_bounded(response: httpx.Response, max_bytes: int) -> httpx.Response:
    """A streamed ``response`` read whole, refused (:class:`ApiError`) past ``max_bytes``."""
    body = bytearray()
    try:
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > max_bytes:
                request = response.request
                raise ApiError(request.method, str(request.url), response.status_code,
                               f"answer is over {max_bytes:,} bytes: refused")  # fmt: skip
    finally:
        response.close()
    return httpx.Response(response.status_code, headers=response.headers, content=bytes(body),
                          request=response.request)  # fmt: skip


def _request(model: type[M], **fields: Any) -> M:
    """A request body of the contract; a value it refuses is an :class:`UploadError`, before sending."""
    try:
        return model(**fields)
    except pydantic.ValidationError as exc:
        raise UploadError(f"{model.__name__}: {_first_error(exc)}") from None


class ParityClient:
    """The REST API of one Parity server, one method per endpoint, JSON in and typed dicts out.

    ``server`` is the base URL (``http://host:port``; a trailing ``/api/v1`` is removed, see
    :func:`~parity.client.server_address.base_url`); ``token`` is sent as
    ``Authorization: Bearer`` on every request. A ``client`` passed in is used as is and not closed here.
    """

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        client: httpx.Client | None = None,
        timeout: float = 60.0,
    ) -> None:
        if not server:
            raise UploadError("no Parity server given (pass --server or set PARITY_SERVER)")
        try:
            self.server = base_url(server)
        except ValueError as exc:
            raise UploadError(f"server {exc}") from None
        try:
            token = clean_token(token) if token else None
        except ValueError as exc:
            raise UploadError(f"token: {exc}") from None
        self._api = self.server + API_PREFIX
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_client = client is None
        # Connect fails fast (a down server must not stall the uploader); reads may be slow on big files.
        self._http = client or httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0))

    # -- plumbing ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool, unless the ``httpx.Client`` was handed in."""
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> ParityClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: list[tuple[str, Any]] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        ok: Sequence[int] = (200,),
        max_bytes: int | None = None,
    ) -> httpx.Response:
        """One request; ``max_bytes``: the answer is read up to that size and refused past it (a server's
        answer that the training process holds, such as a plan, cannot take its memory)."""
        url = self._api + path
        all_headers = {**self._headers, **(headers or {})}
        request = self._http.build_request(method, url, json=json, params=httpx.QueryParams(params or []),
                                           content=content, headers=all_headers)  # fmt: skip
        try:
            response = self._http.send(request, stream=max_bytes is not None)
            if max_bytes is not None:
                response = _read_bounded(response, max_bytes)
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise ServerUnreachable(f"{method} {url}: server unreachable: {reason}"
                                    f"{unreachable_hint(self.server)}") from None  # fmt: skip
        if response.status_code not in ok:
            raise ApiError(method, url, response.status_code, _detail(response))
        return response

    # -- server -----------------------------------------------------------------------------------------

    def health(self) -> bool:
        """Whether ``GET /healthz`` answers ``{"status": "ok"}`` (never raises)."""
        try:
            response = self._http.get(self.server + "/healthz", timeout=5.0)
            return response.status_code == 200 and Health.model_validate_json(response.content).status == "ok"
        except (httpx.HTTPError, ValueError):  # pydantic's ValidationError is a ValueError
            return False

    def check_access(self, timeout: float) -> None:
        """One quick request that needs what an upload needs: an answer, a known token, the right to write.

        ``POST /runs`` with an empty body: the server checks the token before it reads a body, so the answer
        is 401 or 403 for a token it refuses, and 422 (every field missing) for one it takes; nothing is
        created. Raises :class:`ServerUnreachable` (no answer within ``timeout`` seconds per operation) or
        :class:`ApiError` (any answer but that 422: a 404 is no Parity API at this URL)."""
        url = self._api + "/runs"
        headers = {**self._headers, "Content-Type": "application/json"}
        try:
            response = self._http.post(url, content=b"{}", headers=headers, timeout=timeout)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"POST {url}: server unreachable: {exc or type(exc).__name__}"
                                    f"{unreachable_hint(self.server)}") from None  # fmt: skip
        if response.status_code != 422:
            raise ApiError("POST", url, response.status_code, _detail(response))

    def _call(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        body: pydantic.BaseModel | None = None,
        params: list[tuple[str, Any]] | None = None,
        ok: Sequence[int] = (200,),
        max_bytes: int | None = None,
    ) -> M:
        """One JSON request whose answer is parsed as ``model``, the contract's type for that endpoint."""
        json = body.model_dump(mode="json") if body is not None else None
        response = self._send(method, path, json=json, params=params, ok=ok, max_bytes=max_bytes)
        try:
            return model.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise ApiError(
                method, self._api + path, response.status_code,
                f"answer is not a {model.__name__} of the REST contract: {_first_error(exc)}",
            ) from None  # fmt: skip

    # -- runs -------------------------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        *,
        project: str = "default",
        device: str = "other",
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        planned_by: str | None = None,
    ) -> RunPublic:
        """``POST /runs``: a new run in status ``uploading``; ``planned_by``: the comparison whose plan its
        dump followed."""
        body = _request(
            RunCreate, name=name, project=project, device=device, tags=dict(tags or {}),
            metadata=dict(metadata or {}), planned_by=planned_by,
        )  # fmt: skip
        return self._call(RunPublic, "POST", "/runs", body=body, ok=(200, 201))

    def get_run(self, run_id: str) -> RunPublic:
        """``GET /runs/{id}`` (ids only; see :meth:`resolve_run` for names)."""
        return self._call(RunPublic, "GET", f"/runs/{quote(run_id, safe='')}")

    def list_runs(
        self,
        *,
        name: str | None = None,
        name_contains: str | None = None,
        project: str | None = None,
        device: str | None = None,
        status: str | None = None,
        tags: Mapping[str, str] | None = None,
        limit: int = 50,
        offset: int = 0,
        verdicts: bool = False,
    ) -> tuple[list[RunPublic], int]:
        """One page of ``GET /runs`` and the total count of runs matching the filters (``name`` exact,
        ``name_contains`` a substring in any case, every one of ``tags``); ``verdicts``: each run with its
        verdict against its project's baseline (``RunPublic.verdict``)."""
        params: list[tuple[str, Any]] = [("limit", limit), ("offset", offset)]
        if verdicts:
            params.append(("verdicts", "true"))
        for key, value in (("name", name), ("name_contains", name_contains), ("project", project),
                           ("device", device), ("status", status)):  # fmt: skip
            if value is not None:
                params.append((key, value))
        params.extend(("tag", f"{k}={v}") for k, v in (tags or {}).items())
        page = self._call(RunsPublic, "GET", "/runs", params=params)
        return page.data, page.count

    def find_runs(self, **filters: Any) -> list[RunPublic]:
        """Every run matching the :meth:`list_runs` filters, all pages."""
        found: list[RunPublic] = []
        while True:
            page, total = self.list_runs(limit=200, offset=len(found), **filters)
            found.extend(page)
            if not page or len(found) >= total:
                return found

    def resolve_run(self, ref: str, *, project: str | None = None) -> RunPublic:
        """A run from its id or its name; a name that matches several runs is an error listing their ids."""
        if _RUN_ID.match(ref):
            try:
                return self.get_run(ref)
            except ApiError as exc:
                if exc.status_code != 404:
                    raise
        runs = self.find_runs(name=ref, project=project)
        if not runs:
            where = f" in project {project!r}" if project else ""
            raise UploadError(f"no run with id or name {ref!r}{where} on {self.server}")
        if len(runs) > 1:
            listed = ", ".join(f"{r.id} ({r.project}, {r.status}, {r.created_at.isoformat()})" for r in runs)
            raise UploadError(f"run name {ref!r} is ambiguous, pass one of these ids: {listed}")
        return runs[0]

    def upload_file(self, run_id: str, rel_path: str, file_path: Path, *, sha256: str | None = None) -> bool:
        """``PUT /runs/{id}/files/{path}``, streamed from disk; True when stored, False when already there."""
        digest = sha256 or sha256_file(file_path)
        size = file_path.stat().st_size
        headers = {
            "X-Content-SHA256": digest,
            "Content-Length": str(size),  # with it httpx sends the iterator as one body, not chunked
            "Content-Type": "application/octet-stream",
        }
        response = self._send(
            "PUT",
            f"/runs/{quote(run_id, safe='')}/files/{quote(rel_path, safe='/')}",
            content=_iter_file(file_path),
            headers=headers,
            ok=(200, 201),
        )
        return response.status_code == 201

    def list_files(self, run_id: str) -> list[FilePublic]:
        """``GET /runs/{id}/files``: what is already stored (to resume an upload)."""
        return self._call(FilesPublic, "GET", f"/runs/{quote(run_id, safe='')}/files").data

    def complete_run(self, run_id: str) -> RunPublic:
        """``POST /runs/{id}/complete``: the server queues the validation of every dump.json and answers at
        once with the run ``validating`` (or ``complete`` when it already was); a worker then makes it
        ``complete`` or ``invalid``. :func:`parity.client.upload.complete_run` also waits for that."""
        return self._call(RunPublic, "POST", f"/runs/{quote(run_id, safe='')}/complete", ok=(200, 202))

    def delete_run(self, run: str, *, with_comparisons: bool = False) -> None:
        """``DELETE /runs/{id or name}`` with its files; a run that comparisons use is refused (409) unless
        ``with_comparisons``, which deletes them and their reports too."""
        params = [("with_comparisons", "true")] if with_comparisons else None
        self._send("DELETE", f"/runs/{quote(run, safe='')}", params=params, ok=(200, 204))

    def update_run(
        self, run: str, *, name: str | None = None, tags: Mapping[str, str] | None = None,
        baseline: bool | None = None,
    ) -> RunPublic:  # fmt: skip
        """``PATCH /runs/{id or name}``: rename, retag, or make the run its project's baseline."""
        new_tags = dict(tags) if tags is not None else None
        body = _request(RunUpdate, name=name, tags=new_tags, baseline=baseline)  # a null field stays as it is
        return self._call(RunPublic, "PATCH", f"/runs/{quote(run, safe='')}", body=body)

    def set_baseline(self, ref: str, *, project: str | None = None) -> RunPublic:
        """Make the run ``ref`` (an id or a name, looked up in ``project`` when given) its project's baseline.

        Without ``project`` the name goes in the path, as on every route; a server whose ``PATCH`` takes ids
        only (404) is asked again with the id :meth:`resolve_run` finds, which also says when a name is
        unknown or several runs have it. With ``project`` the id is looked up first: a path holds no project.
        """
        if project is None:
            try:
                return self.update_run(ref, baseline=True)
            except ApiError as exc:
                if exc.status_code != 404:
                    raise
        return self.update_run(self.resolve_run(ref, project=project).id, baseline=True)

    # -- acceptances ------------------------------------------------------------------------------------

    def accept(self, project: str, api: str, note: str, *, author: str | None = None) -> AcceptancePublic:
        """``POST /projects/{project}/acceptances``: the failing ``api`` counts as known, with ``note``."""
        body = _request(AcceptanceCreate, api=api, note=note, author=author)
        path = f"/projects/{quote(project, safe='')}/acceptances"
        return self._call(AcceptancePublic, "POST", path, body=body, ok=(200, 201))

    def acceptances(self, project: str) -> list[AcceptancePublic]:
        """``GET /projects/{project}/acceptances``: the failing APIs accepted in ``project``, with notes."""
        path = f"/projects/{quote(project, safe='')}/acceptances"
        return self._call(AcceptancesPublic, "GET", path).data

    def revoke_acceptance(self, project: str, api: str) -> None:
        """``DELETE /projects/{project}/acceptances/{api}``: ``api`` fails as new or worse again."""
        self._send("DELETE", f"/projects/{quote(project, safe='')}/acceptances/{quote(api, safe='')}",
                   ok=(200, 204))  # fmt: skip

    # -- comparisons ------------------------------------------------------------------------------------

    def create_comparison(
        self,
        target_run: str,
        bench_run: str,
        *,
        step: int | None = None,
        ranks: Sequence[int] | None = None,
        fuzzy_match: bool = False,
        stack_mode: bool = False,
        project: str | None = None,
    ) -> ComparisonPublic:
        """``POST /comparisons``: queue a comparison of two complete runs, by id or name (names looked up in
        ``project`` when given). The same request again returns the existing comparison; a failed one is
        queued again under its id."""
        body = _request(
            ComparisonCreate, target_run=target_run, bench_run=bench_run, project=project, step=step,
            ranks=list(ranks) if ranks else None,
            options=ComparisonOptions(fuzzy_match=fuzzy_match, stack_mode=stack_mode),
        )  # fmt: skip
        return self._call(ComparisonPublic, "POST", "/comparisons", body=body, ok=(200, 201, 202))

    def get_comparison(self, comparison_id: str) -> ComparisonPublic:
        """``GET /comparisons/{id}``: status, progress and, once succeeded, the summary."""
        return self._call(ComparisonPublic, "GET", f"/comparisons/{quote(comparison_id, safe='')}")

    def get_plan(self, comparison_id: str, *, top: int | None = None, neighbours: int | None = None
                 ) -> PlanPublic:  # fmt: skip
        """``GET /comparisons/{id}/plan``: the next dump's msprobe config.json (None: no suspects)."""
        params = [(k, v) for k, v in (("top", top), ("neighbours", neighbours)) if v is not None]
        path = f"/comparisons/{quote(comparison_id, safe='')}/plan"
        return self._call(PlanPublic, "GET", path, params=params, max_bytes=MAX_PLAN_BYTES)

    def list_comparisons(
        self,
        *,
        run: str | None = None,
        project: str | None = None,
        status: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[ComparisonPublic], int]:
        """One page of ``GET /comparisons`` and the total count."""
        params: list[tuple[str, Any]] = [("limit", limit), ("offset", offset)]
        for key, value in (("run", run), ("project", project), ("status", status)):
            if value is not None:
                params.append((key, value))
        page = self._call(ComparisonsPublic, "GET", "/comparisons", params=params)
        return page.data, page.count

    def regressions(self, comparison_id: str) -> RegressionsPublic:
        """``GET /comparisons/{id}/regressions``: each failing API of a comparison against its project's
        baseline as new, worse, known or fixed, new and worse first (``against_baseline`` false otherwise)."""
        path = f"/comparisons/{quote(comparison_id, safe='')}/regressions"
        return self._call(RegressionsPublic, "GET", path)

    def comparison_rows(
        self,
        comparison_id: str,
        *,
        failing: bool | None = None,
        status: Sequence[str] = (),
        name: str | None = None,
        rank: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> RowsPublic:
        """One page of ``GET /comparisons/{id}/rows``. ``failing`` keeps the fail, warning and unmatched rows;
        ``status`` the rows of these statuses."""
        params: list[tuple[str, Any]] = [("limit", limit), ("offset", offset)]
        if failing is not None:
            params.append(("failing", "true" if failing else "false"))
        if status:
            params.append(("status", ",".join(status)))
        if name is not None:
            params.append(("name", name))
        if rank is not None:
            params.append(("rank", rank))
        path = f"/comparisons/{quote(comparison_id, safe='')}/rows"
        return self._call(RowsPublic, "GET", path, params=params)

    def wait_for_comparison(
        self,
        comparison_id: str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.5,
        on_progress: Callable[[ComparisonPublic], None] | None = None,
    ) -> ComparisonPublic:
        """Poll until the comparison succeeded or failed; a timeout is an :class:`UploadError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get_comparison(comparison_id)
            if on_progress is not None:
                on_progress(info)
            if info.status in ("succeeded", "failed"):
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise UploadError(
                    f"comparison {comparison_id} still {info.status} after {timeout:g} s "
                    f"(progress {info.progress:.0%})"
                )
            time.sleep(poll_interval)

    def download(self, comparison_id: str, file_name: str, dest: Path, *, rank: int | None = None) -> Path:
        """Stream ``GET /comparisons/{id}/{file_name}`` (report.xlsx, advisor.txt, summary.json) to ``dest``.

        Written to a temporary name first, so an interrupted download never leaves a truncated report.
        """
        url = f"{self._api}/comparisons/{quote(comparison_id, safe='')}/{file_name}"
        params = {"rank": rank} if rank is not None else None
        partial = dest.with_name(dest.name + ".part")
        try:
            with self._http.stream("GET", url, params=params, headers=self._headers) as response:
                if response.status_code != 200:
                    response.read()
                    raise ApiError("GET", url, response.status_code, _detail(response))
                dest.parent.mkdir(parents=True, exist_ok=True)
                with partial.open("wb") as fh:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        fh.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise ServerUnreachable(f"GET {url}: server unreachable: {exc or type(exc).__name__}"
                                    f"{unreachable_hint(self.server)}") from None  # fmt: skip
        os.replace(partial, dest)
        return dest
