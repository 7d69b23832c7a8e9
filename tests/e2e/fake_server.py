"""An in-memory stand-in for the Parity server's REST contract, served through ``httpx.MockTransport``.

It implements just enough of ``/api/v1`` (runs, files, complete, comparisons, downloads) for the client's
unit tests to check what the client sends, and lets a test inject failures (``fail``) to exercise retries.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import httpx

FailHook = Callable[[httpx.Request], "httpx.Response | Exception | None"]


class FakeServer:
    """The REST contract in memory; ``requests`` records ``(method, path)`` of every call in order."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.files: dict[str, dict[str, tuple[bytes, str]]] = {}
        self.comparisons: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.headers: list[httpx.Headers] = []
        self.fail: FailHook | None = None
        self.polls_until_done = 1  # GET /comparisons/{id} calls that still answer "running"
        self._lock = threading.Lock()
        self._clock = itertools.count()

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self))

    # -- helpers ------------------------------------------------------------------------------------------

    @staticmethod
    def _json(status: int, body: Any) -> httpx.Response:
        return httpx.Response(status, json=body)

    def _error(self, status: int, detail: str) -> httpx.Response:
        return self._json(status, {"detail": detail})

    def _run_public(self, run_id: str) -> dict[str, Any]:
        run = dict(self.runs[run_id])
        files = self.files[run_id]
        run["file_count"] = len(files)
        run["total_bytes"] = sum(len(b) for b, _ in files.values())
        run["steps"] = sorted({int(p.split("/")[0][4:]) for p in files})
        run["ranks"] = sorted({int(p.split("/")[1][4:]) for p in files})
        return run

    # -- the handler ----------------------------------------------------------------------------------------

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append((request.method, request.url.path))
            self.headers.append(request.headers)
        if self.fail is not None:
            injected = self.fail(request)
            if isinstance(injected, Exception):
                raise injected
            if injected is not None:
                return injected
        path = request.url.path
        if path == "/healthz":
            return self._json(200, {"status": "ok"})
        if not path.startswith("/api/v1/"):
            return self._error(404, f"{path}: not found")
        with self._lock:
            return self._route(request, path[len("/api/v1") :])

    def _route(self, request: httpx.Request, path: str) -> httpx.Response:
        method = request.method
        params = request.url.params
        if path == "/runs" and method == "POST":
            body = json.loads(request.content)
            run_id = uuid.uuid4().hex
            self.runs[run_id] = {
                "id": run_id,
                "name": body["name"],
                "project": body.get("project", "default"),
                "device": body["device"],
                "tags": body.get("tags", {}),
                "metadata": body.get("metadata", {}),
                "status": "uploading",
                "error": None,
                "created_at": f"2026-01-01T00:{next(self._clock):05d}",
                "completed_at": None,
            }
            self.files[run_id] = {}
            return self._json(201, self._run_public(run_id))
        if path == "/runs" and method == "GET":
            runs = [self._run_public(r) for r in self.runs]
            for key in ("name", "project", "status", "device"):
                if key in params:
                    runs = [r for r in runs if r[key] == params[key]]
            return self._json(200, {"data": runs, "count": len(runs)})
        if m := re.fullmatch(r"/runs/([0-9a-f]+)/files/(.+)", path):
            run_id, rel = m[1], m[2]
            if run_id not in self.runs:
                return self._error(404, f"run {run_id}: not found")
            if self.runs[run_id]["status"] == "complete":
                return self._error(409, f"run {run_id}: already complete")
            data = request.read()
            declared = request.headers.get("X-Content-SHA256", "")
            if not re.fullmatch(r"[0-9a-f]{64}", declared):
                return self._error(400, "X-Content-SHA256: not a hex sha256")
            if hashlib.sha256(data).hexdigest() != declared:
                return self._error(422, f"{rel}: sha256 mismatch")
            have = self.files[run_id].get(rel)
            if have is not None:
                if have[1] == declared:
                    return self._json(200, {"path": rel, "size": len(data), "sha256": declared})
                return self._error(409, f"{rel}: exists with other content")
            self.files[run_id][rel] = (data, declared)
            return self._json(201, {"path": rel, "size": len(data), "sha256": declared})
        if m := re.fullmatch(r"/runs/([0-9a-f]+)/files", path):
            files = [{"path": p, "size": len(b), "sha256": s} for p, (b, s) in self.files[m[1]].items()]
            return self._json(200, {"data": files, "count": len(files)})
        if m := re.fullmatch(r"/runs/([0-9a-f]+)/complete", path):
            run_id = m[1]
            if not any(p.endswith("/dump.json") for p in self.files[run_id]):
                return self._error(422, "no dump.json in the run")
            self.runs[run_id]["status"] = "complete"
            return self._json(200, self._run_public(run_id))
        if m := re.fullmatch(r"/runs/([0-9a-f]+)", path):
            if m[1] not in self.runs:
                return self._error(404, f"run {m[1]}: not found")
            return self._json(200, self._run_public(m[1]))
        if path == "/comparisons" and method == "POST":
            body = json.loads(request.content)
            for role in ("target_run", "bench_run"):
                if body[role] not in self.runs:
                    return self._error(404, f"{role} {body[role]}: not found")
            ranks = self._run_public(body["target_run"])["ranks"]
            cid = uuid.uuid4().hex
            self.comparisons[cid] = {
                **body,
                "id": cid,
                "status": "queued",
                "error": None,
                "progress": 0.0,
                "polls": 0,
                "summary": None,
                "all_ranks": body.get("ranks") or ranks,
            }
            return self._json(202, self._comparison(cid))
        if m := re.fullmatch(r"/comparisons/([0-9a-f]+)", path):
            c = self.comparisons[m[1]]
            c["polls"] += 1
            if c["polls"] > self.polls_until_done:
                c.update(
                    status="succeeded",
                    progress=1.0,
                    summary={
                        "rows": 4,
                        "failing_rows": 1,
                        "failing_apis": ["Functional.gelu.0.forward"],
                        "top_suspects": [
                            {
                                "rank": 1,
                                "api": "Functional.gelu.0.forward",
                                "direction": "forward",
                                "row_index": 2,
                                "reason": "output differs",
                                "stack": None,
                                "compare_rank": c["all_ranks"][0],
                            }
                        ],
                        "ranks": c["all_ranks"],
                        "mode": "summary",
                    },
                )
            else:
                c.update(status="running", progress=0.5)
            return self._json(200, self._comparison(m[1]))
        if m := re.fullmatch(r"/comparisons/([0-9a-f]+)/(report\.xlsx|advisor\.txt)", path):
            c = self.comparisons[m[1]]
            ranks = c["all_ranks"]
            if "rank" in params:
                rank = int(params["rank"])
                if rank not in ranks:
                    return self._error(400, f"rank {rank}: not compared (ranks {ranks})")
            elif len(ranks) > 1:
                return self._error(400, f"rank: required, ranks available {ranks}")
            else:
                rank = ranks[0]
            return httpx.Response(200, content=f"{m[2]} of {m[1]} rank {rank}".encode())
        return self._error(404, f"{method} {path}: no such route in the fake")

    def _comparison(self, cid: str) -> dict[str, Any]:
        return {k: v for k, v in self.comparisons[cid].items() if k not in ("polls", "all_ranks")}
