"""The child interpreter that parses a run's dump.json files for its validation (``validation.validate_dumps``
starts it as ``python -m parity.server.jobs.parse_child``): it reads ``{"parent", "dumps"}`` on stdin, writes
each dump's sidecar, prints ``{"problem": ...}`` and exits, giving its memory back. It imports the parse and
nothing of the server (no database, no store): its memory is the dump's columns and an interpreter.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path


def _child_main() -> None:
    """``python -m parity.server.jobs.parse_child``: reads ``{"parent", "dumps"}`` from stdin and prints
    ``{"problem": ...}``; dies with the worker that started it."""
    from parity.process_policy import die_with_parent

    request = json.load(sys.stdin)
    die_with_parent(int(request["parent"]))
    problem = first_problem([(rel, local, sidecar) for rel, local, sidecar in request["dumps"]])
    sys.stdout.write(json.dumps({"problem": problem}))


def first_problem(dumps: Sequence[tuple[str, str, str | None]]) -> str | None:
    """In the child: ``rel: problem`` for the first ``(rel, local path, sidecar path)`` that does not parse,
    else None; each dump that parses has its sidecar written (when a sidecar path is given)."""
    from parity.shared.dump.sidecar import write_sidecar
    from parity.shared.dump.stream import stream_dump
    from parity.shared.errors import ParityError

    from parity.process_policy import collector_paused

    for rel, local, sidecar in dumps:
        try:
            with collector_paused():
                dump = stream_dump(Path(local))  # incrementally: memory of its columns, not of its text
        except ParityError as exc:
            return f"{rel}: {describe(exc)}"
        if sidecar is not None:
            write_sidecar(dump, Path(sidecar))
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
