"""Parsing a run's dump.json files for its validation, in a short-lived child interpreter.

Parsing a dump.json takes about 7x its size in memory (a 200 MB file: ~1.4 GB). The worker's validation job
(``validation_task``) does it in a short-lived child interpreter (``python -m parity.server.jobs.validation``,
a subprocess and not a multiprocessing child: a Celery prefork worker's processes are daemonic, and
multiprocessing refuses them children), one file after another, so its own memory stays that of a worker and
the parse's goes back to the system when the child exits; the child dies with the worker
(``PR_SET_PDEATHSIG``). The child writes each dump's parsed columns (``shared.dump.sidecar``), which the
worker stores beside the blob for the compare jobs, and returns only the first problem's text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from parity.server.jobs.base import die_with_parent


# -- the parse, in a child process ------------------------------------------------------------------------
def validate_dumps(dumps: Sequence[tuple[str, Path]], sidecar_dir: Path | None = None) -> str | None:
    """The first problem among ``(rel, local path)`` dump.json files, parsed in a child interpreter; with
    ``sidecar_dir``, the sidecar of the i-th file is written there as ``{i}.columns``. Raises
    :class:`ValidationChildError` when the child itself fails (killed, out of memory, a bug)."""
    work = [(rel, str(path), str(sidecar_dir / f"{i}.columns") if sidecar_dir else None)
            for i, (rel, path) in enumerate(dumps)]  # fmt: skip
    request = json.dumps({"parent": os.getpid(), "dumps": work})
    done = subprocess.run([sys.executable, "-m", __name__], input=request, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise ValidationChildError(f"the parsing child failed: {tail[0]}")
    problem: str | None = json.loads(done.stdout)["problem"]
    return problem


class ValidationChildError(RuntimeError):
    """The child that parses the dump.json files ended without an answer."""


def _child_main() -> None:
    """``python -m parity.server.jobs.validation``: reads ``{"parent", "dumps"}`` from stdin and prints
    ``{"problem": ...}``; dies with the worker that started it."""
    request = json.load(sys.stdin)
    die_with_parent(int(request["parent"]))
    problem = first_problem([(rel, local, sidecar) for rel, local, sidecar in request["dumps"]])
    sys.stdout.write(json.dumps({"problem": problem}))


def first_problem(dumps: Sequence[tuple[str, str, str | None]]) -> str | None:
    """In the child: ``rel: problem`` for the first ``(rel, local path, sidecar path)`` that does not parse,
    else None; each dump that parses has its sidecar written (when a sidecar path is given)."""
    from parity.shared.dump.reader import load_dump
    from parity.shared.dump.sidecar import encode_sidecar
    from parity.shared.errors import ParityError

    from parity.process_policy import collector_paused

    for rel, local, sidecar in dumps:
        try:
            with collector_paused():
                dump = load_dump(Path(local))
        except ParityError as exc:
            return f"{rel}: {describe(exc)}"
        if sidecar is not None:
            Path(sidecar).write_bytes(encode_sidecar(dump))
        del dump
    return None


def describe(exc: Exception) -> str:
    """The problem without the server-side path the reader names (the client knows the file by ``rel``)."""
    where = getattr(exc, "where", None)
    problem = getattr(exc, "problem", None)
    if problem is None:
        return str(exc)
    return f"{where}: {problem}" if where else str(problem)


if __name__ == "__main__":
    _child_main()
