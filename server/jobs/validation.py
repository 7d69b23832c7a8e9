"""Validating uploaded dump.json files off the API process: ``validate_dumps`` runs in a child process.

Parsing a dump.json takes about 7x its size in memory (a 200 MB file: ~1.4 GB) and seconds of CPU holding
the GIL; done in the API process, three completes at once ran it out of memory and stalled ``/healthz``.
Here each complete hands the local paths to a fresh spawned process, which parses them one by one and
returns only the first problem's text; its memory goes back to the system when it exits, and the API
process only waits (in a worker thread) for a string.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def first_problem(dumps: Sequence[tuple[str, str]]) -> str | None:
    """In the child: ``rel: problem`` for the first ``(rel, local path)`` that does not parse, else None."""
    from parity.shared.dump.reader import load_dump
    from parity.shared.errors import ParityError

    from parity.process_policy import collector_paused

    for rel, local in dumps:
        try:
            with collector_paused():
                load_dump(Path(local))
        except ParityError as exc:
            return f"{rel}: {describe(exc)}"
    return None


def validate_dumps(dumps: Sequence[tuple[str, Path]]) -> str | None:
    """The first problem among ``(rel, local path)`` dump.json files, parsed in a child process."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(first_problem, [(rel, str(path)) for rel, path in dumps]).result()


def describe(exc: Exception) -> str:
    """The problem without the server-side path the reader names (the client knows the file by ``rel``)."""
    where = getattr(exc, "where", None)
    problem = getattr(exc, "problem", None)
    if problem is None:
        return str(exc)
    return f"{where}: {problem}" if where else str(problem)
