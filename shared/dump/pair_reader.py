"""Read the two dumps of a compare at once: the bench one in a child process, the NPU one here.

Parsing and flattening a dump.json is pure Python and takes about a quarter of a second per 60k rows; the
two sides are independent, so on a machine with two cores they overlap. The child sends its dump back as the
``DumpColumns`` wire form through a pipe (``marshal``: plain lists, bytes and dicts, a few milliseconds to
load, and only this process's own child writes it), then leaves with ``os._exit`` so it never pays for freeing
what it parsed.

The child is a fork where that is safe: ``os.fork`` exists and this process runs a single thread (a fork
copies no other thread, and a lock one of them held would stay held in the child). A process with threads
(a server job worker renewing its lease) starts a fresh interpreter instead, which costs ~50 ms more and
overlaps the same way. Small files are read here: a child costs more than it saves. If the child fails for
any reason other than a bad dump, the bench dump is read here, so the result never depends on the path
taken; a bad dump read by the child raises the same ``DumpError`` as it would here.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from parity.shared.dump.columns import DumpColumns
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.errors import DumpError

logger = logging.getLogger(__name__)

#: below this many bytes of dump.json (both sides) a child process costs more than it saves
MIN_PARALLEL_BYTES = 2 << 20

_OK, _DUMP_ERROR, _FAILED = 0, 1, 2


def load_dump_pair(npu_path: Path, bench_path: Path, *, parallel: bool = True) -> tuple[Dump, Dump]:
    """Both dumps, as ``load_dump`` reads them; the bench one in a child process when ``parallel`` allows."""
    if not (parallel and _big_enough(npu_path, bench_path)):
        return load_dump(npu_path), load_dump(bench_path)
    if hasattr(os, "fork") and threading.active_count() == 1:
        return _read_forked(npu_path, bench_path)
    return _read_spawned(npu_path, bench_path)


def _read_forked(npu_path: Path, bench_path: Path) -> tuple[Dump, Dump]:
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:  # EAGAIN, ENOMEM: no child today, the read still happens
        os.close(read_fd)
        os.close(write_fd)
        logger.warning("cannot fork a reader process (%s); reading %s here", exc, bench_path)
        return load_dump(npu_path), load_dump(bench_path)
    if pid == 0:  # the child: read, send, leave without cleaning up
        os.close(read_fd)
        try:
            _send(write_fd, _child_payload(bench_path))
        finally:
            os._exit(0)
    os.close(write_fd)
    logger.debug("reading %s in child process %d, %s here", bench_path, pid, npu_path)
    try:
        npu = load_dump(npu_path)
        payload = _receive(read_fd)
    except BaseException:
        _reap(pid, kill=True)
        raise
    finally:
        os.close(read_fd)
    _reap(pid, kill=False)
    return npu, _bench_from(payload, bench_path)


def _read_spawned(npu_path: Path, bench_path: Path) -> tuple[Dump, Dump]:
    # The child sees this process's import path, so it imports the same parity as this process does.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SPAWNED_CHILD, str(bench_path)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    except OSError as exc:
        logger.warning("cannot start a reader process (%s); reading %s here", exc, bench_path)
        return load_dump(npu_path), load_dump(bench_path)
    logger.debug("reading %s in reader process %d, %s here", bench_path, proc.pid, npu_path)
    try:
        npu = load_dump(npu_path)
        payload, errors = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0 and not payload:
        last = errors.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        payload = marshal.dumps((_FAILED, last[0]))
    return npu, _bench_from(payload, bench_path)


#: what a spawned reader runs: the same payload as a forked one, written to its standard output
_SPAWNED_CHILD = (
    "import os, sys\n"
    "from pathlib import Path\n"
    "from parity.shared.dump.pair_reader import _child_payload\n"
    "sys.stdout.buffer.write(_child_payload(Path(sys.argv[1])))\n"
    "sys.stdout.flush()\n"
    "os._exit(0)\n"
)


def _big_enough(npu_path: Path, bench_path: Path) -> bool:
    try:
        size = os.path.getsize(npu_path) + os.path.getsize(bench_path)
    except OSError:
        return False  # a missing file: let load_dump name it
    return size >= MIN_PARALLEL_BYTES


def _child_payload(path: Path) -> bytes:
    try:
        dump = load_dump(path)
        header = (str(dump.path), dump.task, dump.level, dump.framework, dump.dump_data_dir, dump.has_md5)
        return marshal.dumps((_OK, header, dump.columns.to_wire()))
    except DumpError as exc:
        return marshal.dumps((_DUMP_ERROR, exc.file, exc.problem, exc.where))
    except BaseException as exc:  # noqa: BLE001 - anything else: the parent reads the file itself
        return marshal.dumps((_FAILED, f"{type(exc).__name__}: {exc}"))


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


def _receive(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _reap(pid: int, *, kill: bool) -> None:
    if kill:
        with contextlib.suppress(ProcessLookupError):  # it may have finished already; waitpid still reaps it
            os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _bench_from(payload: bytes, path: Path) -> Dump:
    try:
        message: Any = marshal.loads(payload) if payload else (_FAILED, "no answer")
    except (EOFError, ValueError, TypeError):  # a child that died halfway through its answer
        message = (_FAILED, f"a truncated answer of {len(payload)} bytes")
    if not isinstance(message, tuple) or not message:
        message = (_FAILED, "an answer of the wrong shape")
    if message[0] == _OK:
        (dump_path, task, level, framework, dump_data_dir, has_md5), wire = message[1], message[2]
        columns = DumpColumns.from_wire(wire)
        return Dump(path=Path(dump_path), task=task, level=level, framework=framework,
                    dump_data_dir=dump_data_dir, columns=columns, has_md5=has_md5)  # fmt: skip
    if message[0] == _DUMP_ERROR:
        raise DumpError(message[1], message[2], where=message[3])
    logger.warning("reading %s in a child process failed (%s); reading it here", path, message[1])
    return load_dump(path)
