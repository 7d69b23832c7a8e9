"""Read the two dumps of a compare at once: the bench one in a reader process, the NPU one here.

Reading a dump.json is pure Python and takes about 0.15 s per 60k rows; the two sides are independent, so on
a machine with two cores they overlap. The bench side is read by a reader process: a second interpreter,
started on first use and then kept. Each request on its standard input is a path and the directory it is
relative to, and each answer on its standard output the ``DumpColumns`` wire form; both are length-prefixed
``marshal``, so that any path (a newline in it, bytes that are not UTF-8) makes the trip whole.

Why a kept process rather than a fork per compare, measured on the benchmark's 60k-row pair:
- A fork shares this process's heap copy-on-write. Each page either side then writes is copied first: twice
  the page faults here (18.6k against 9k), and this side's own read ran 25 % slower. The pair took 0.29–0.31 s
  forked, against 0.23–0.27 s with the kept reader.
- Starting an interpreter for every compare costs ~0.1 s.
- A kept reader needs no care about this process's threads. A server job worker renews its lease on a
  thread, and a fork would copy none of them, nor release the locks they held.

The reader leaves when this process closes its input (on exit, or in ``close_reader``), or after
``IDLE_EXIT_S`` seconds without a request, so that an idle process does not keep its memory. A process
that forks does not share its reader: the child starts its own.

Small files are read here, because a request costs more than it saves. If the reader fails for any reason
other than a bad dump, the bench dump is read here and the reader is replaced next time, so the result never
depends on the path taken. A bad dump read by the reader raises the same ``DumpError`` it would raise here.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import marshal
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from parity.shared.dump.columns import DumpColumns
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.errors import DumpError

logger = logging.getLogger(__name__)

#: below this many bytes of dump.json (both sides) a request to the reader costs more than it saves
MIN_PARALLEL_BYTES = 2 << 20
#: an idle reader leaves after this long; the next compare starts another (~0.1 s, overlapped)
IDLE_EXIT_S = 60.0

_OK, _DUMP_ERROR, _FAILED = 0, 1, 2
_LENGTH = struct.Struct("<Q")


def load_dump_pair(npu_path: Path, bench_path: Path, *, parallel: bool = True) -> tuple[Dump, Dump]:
    """Both dumps, as ``load_dump`` reads them; the bench one in the reader process when ``parallel`` allows.

    One compare at a time uses the reader; a thread that finds it busy reads both dumps itself.
    """
    if not (parallel and _big_enough(npu_path, bench_path)) or not _lock.acquire(blocking=False):
        return load_dump(npu_path), load_dump(bench_path)
    try:
        return _read_with_reader(npu_path, bench_path)
    finally:
        _lock.release()


def start_reader() -> None:
    """Start the reader process now, if none runs, so that a compare about to come finds it ready.

    The command line calls this before it imports the engine: the reader's start (~0.1 s) then overlaps.
    """
    with _lock:
        _reader()


def close_reader() -> None:
    """Stop the reader process, if one runs (it also stops by itself when this process exits)."""
    global _current
    with _lock:
        if _current is not None:
            _current.close()
            _current = None


class _ReaderProcess:
    """The reader interpreter and the two ends of its pipes; owned by the process that started it."""

    def __init__(self) -> None:
        # The reader sees this process's import path, so it imports the same parity as this process does.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _READER_LOOP, repr(IDLE_EXIT_S)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.owner = os.getpid()
        logger.debug("started reader process %d", self.proc.pid)

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def ask(self, path: Path) -> None:
        """Send ``path`` as this process names it: a relative one with this process's directory."""
        where = None if path.is_absolute() else os.fsencode(os.getcwd())
        request = marshal.dumps((where, os.fsencode(path)))
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        stdin.write(_frame(request))
        stdin.flush()

    def answer(self) -> bytes:
        return _unframe(self.proc.stdout)  # type: ignore[arg-type]

    def close(self, *, kill: bool = False) -> None:
        """Close its input, so that it leaves, and reap it; ``kill`` it first if its answer is not wanted."""
        if self.owner != os.getpid():
            return  # a forked child's copy: the reader is its parent's to close
        if kill:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_current: _ReaderProcess | None = None
_inherited: list[_ReaderProcess] = []  # a forked child's copies of its parent's reader: kept, never used


def _reader() -> _ReaderProcess:
    """The running reader, started (again) if there is none, it left, or it belongs to the parent process."""
    global _current
    if _current is None or not _current.alive():
        if _current is not None:
            _current.close()
        _current = _ReaderProcess()
    return _current


def _forget_after_fork() -> None:
    global _current, _lock
    _lock = threading.Lock()  # another thread of the parent may have held it: it would never be released
    if _current is not None:
        _inherited.append(_current)  # its pipes are the parent's; dropping it would reap nothing and warn
        _current = None


def _close_at_exit() -> None:
    if _current is not None:
        _current.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_close_at_exit)


def _read_with_reader(npu_path: Path, bench_path: Path) -> tuple[Dump, Dump]:
    global _current
    reader = _ask(bench_path)
    if reader is None:
        return load_dump(npu_path), load_dump(bench_path)
    logger.debug("reading %s in reader process %d, %s here", bench_path, reader.proc.pid, npu_path)
    try:
        npu = load_dump(npu_path)
        payload = reader.answer()
    except BaseException:
        reader.close(kill=True)  # its answer is pending and nobody will read it: start afresh next time
        _current = None
        raise
    if not payload:  # it left (idle, killed, crashed) before answering
        reader.close(kill=True)
        _current = None
    return npu, _bench_from(payload, bench_path)


def _ask(bench_path: Path) -> _ReaderProcess | None:
    """The reader, asked for ``bench_path``; None (with a warning) when no reader can be had or asked."""
    global _current
    failure: OSError | None = None
    for _attempt in range(2):  # a reader that left just now (its idle time ran out) is replaced once
        try:
            reader = _reader()
        except OSError as exc:  # no process today (EAGAIN, ENOMEM): the read still happens, here
            failure = exc
            break
        try:
            reader.ask(bench_path)
            return reader
        except OSError as exc:  # a broken pipe, or this process's directory is gone
            failure = exc
            reader.close(kill=True)
            _current = None
    logger.warning("cannot use a reader process (%s); reading %s here", failure, bench_path)
    return None


def _frame(message: bytes) -> bytes:
    return _LENGTH.pack(len(message)) + message


def _unframe(stream: IO[bytes]) -> bytes:
    """The next framed message on ``stream``; empty once the other end has closed it."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return b""
    return stream.read(_LENGTH.unpack(head)[0])


#: what the reader runs: one framed request at a time on stdin, one framed answer each on stdout
_READER_LOOP = """\
import os, select, sys
from parity.shared.dump.pair_reader import _answer_to, _frame, _unframe
idle = float(sys.argv[1])
requests, answers = sys.stdin.buffer, sys.stdout.buffer
def requested():  # False once idle for too long; select cannot wait on a pipe outside POSIX
    return os.name != "posix" or bool(select.select([requests], [], [], idle)[0])
while requested():
    request = _unframe(requests)
    if not request:
        break
    answers.write(_frame(_answer_to(request)))
    answers.flush()
os._exit(0)
"""


def _big_enough(npu_path: Path, bench_path: Path) -> bool:
    try:
        size = os.path.getsize(npu_path) + os.path.getsize(bench_path)
    except OSError:
        return False  # a missing file: let load_dump name it
    return size >= MIN_PARALLEL_BYTES


def _answer_to(request: bytes) -> bytes:
    """The reader's answer to one request: the dump, read from the directory the asking process was in."""
    try:
        where, path = marshal.loads(request)
        if where is not None:
            os.chdir(where)
    except (EOFError, ValueError, TypeError, OSError) as exc:  # its directory is gone: the parent reads it
        return marshal.dumps((_FAILED, f"{type(exc).__name__}: {exc}"))
    return _child_payload(Path(os.fsdecode(path)))


def _child_payload(path: Path) -> bytes:
    try:
        dump = load_dump(path)
        header = (str(dump.path), dump.task, dump.level, dump.framework, dump.dump_data_dir, dump.has_md5)
        return marshal.dumps((_OK, header, dump.columns.to_wire()))
    except DumpError as exc:
        return marshal.dumps((_DUMP_ERROR, exc.file, exc.problem, exc.where))
    except BaseException as exc:  # noqa: BLE001 - anything else: the parent reads the file itself
        return marshal.dumps((_FAILED, f"{type(exc).__name__}: {exc}"))


def _bench_from(payload: bytes, path: Path) -> Dump:
    try:
        message: Any = marshal.loads(payload) if payload else (_FAILED, "the reader process ended")
    except (EOFError, ValueError, TypeError):  # a reader that died halfway through its answer
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
    logger.warning("reading %s in a reader process failed (%s); reading it here", path, message[1])
    return load_dump(path)
