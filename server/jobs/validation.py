"""Validating uploaded dump.json files off the API process: ``validate_dumps`` runs in a child process.

Parsing a dump.json takes about 7x its size in memory (a 200 MB file: ~1.4 GB) and seconds of CPU holding
the GIL; done in the API process, three completes at once ran it out of memory and stalled ``/healthz``.
Here each complete hands the local paths to a fresh spawned process, which parses them one by one, writes
each one's parsed columns to a sidecar file (``shared.dump.sidecar``: the compare tasks read it instead of
parsing the dump again) and returns only the first problem's text; its memory goes back to the system when
it exits, and the API process only waits (in a worker thread) for a string.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


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


def validate_dumps(dumps: Sequence[tuple[str, Path]], sidecar_dir: Path | None = None) -> str | None:
    """The first problem among ``(rel, local path)`` dump.json files, parsed in a child process; with
    ``sidecar_dir``, the sidecar of the i-th file is written there as ``{i}.columns``."""
    work = [(rel, str(path), str(sidecar_dir / f"{i}.columns") if sidecar_dir else None)
            for i, (rel, path) in enumerate(dumps)]  # fmt: skip
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(first_problem, work).result()


def describe(exc: Exception) -> str:
    """The problem without the server-side path the reader names (the client knows the file by ``rel``)."""
    where = getattr(exc, "where", None)
    problem = getattr(exc, "problem", None)
    if problem is None:
        return str(exc)
    return f"{where}: {problem}" if where else str(problem)
