"""Parsing a run's dump.json files for its validation, in bounded memory.

The worker's validation job (``validation_task``) parses the files in a short-lived child interpreter
(``python -m parity.server.jobs.parse_child``, a subprocess and not a multiprocessing child: a Celery prefork
worker's processes are daemonic, and multiprocessing refuses them children), one file after another, so its
own memory stays that of a worker and the parse's goes back to the system when the child exits; the child
dies with the worker (``PR_SET_PDEATHSIG``). It parses each file incrementally (``shared.dump.stream``), so it
holds the dump's columns, not its text and whole parse (~7x the file: a 150 MB file took +1 GB;
incrementally, under +300 MB for the server's whole process tree). Files of ``IN_PROCESS_BYTES`` or less in
all are parsed in the worker. The child writes each dump's parsed columns (``shared.dump.sidecar``), which
the worker stores beside the blob for the compare jobs, and returns only the first problem's text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: Dumps of at most this many bytes in all are parsed in the worker itself: the incremental parse holds about
#: their size, and a child interpreter's own ~30 MB would be more than that again.
IN_PROCESS_BYTES = 64 * 2**20


def validate_dumps(dumps: Sequence[tuple[str, Path]], sidecar_dir: Path | None = None, *,
                   in_process_bytes: int = IN_PROCESS_BYTES) -> str | None:  # fmt: skip
    """The first problem among ``(rel, local path)`` dump.json files, parsed in a child interpreter (in this
    process when they hold ``in_process_bytes`` or less); with ``sidecar_dir``, the sidecar of the i-th file
    is written there as ``{i}.columns``. Raises :class:`ValidationChildError` when the child itself fails
    (killed, out of memory, a bug)."""
    work = [(rel, str(path), str(sidecar_dir / f"{i}.columns") if sidecar_dir else None)
            for i, (rel, path) in enumerate(dumps)]  # fmt: skip
    if sum(path.stat().st_size for _, path in dumps) <= in_process_bytes:
        from parity.server.jobs.parse_child import first_problem

        return first_problem(work)
    request = json.dumps({"parent": os.getpid(), "dumps": work})
    # The child imports the parse only (parse_child), not the server: 24 MiB less in every parsing child.
    done = subprocess.run([sys.executable, "-m", "parity.server.jobs.parse_child"], input=request,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise ValidationChildError(f"the parsing child failed: {tail[0]}")
    problem: str | None = json.loads(done.stdout)["problem"]
    return problem


class ValidationChildError(RuntimeError):
    """The child that parses the dump.json files ended without an answer."""
