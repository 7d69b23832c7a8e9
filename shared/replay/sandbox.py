"""The float64 replay in a child process of its own, under memory and CPU caps: a crash, a kernel that runs
away or a call that needs more memory than allowed loses that call's verdict, nothing else.

The cost rules (:mod:`parity.shared.replay.cost`) refuse what a crafted dump asks for before it runs; this is
the bound that holds whatever a rule missed, and it holds for native code too (a kernel that reads past a
tensor and segfaults). The parent (:func:`replay_isolated`) starts ``python -m parity.shared.replay.sandbox``
with the request on its stdin; the child

* caps its address space at what the interpreter and torch hold plus ``ReplayBudget.memory_bytes``
  (``RLIMIT_AS``, set once torch is imported; one intra-op thread), so an allocation past it fails inside
  the call ("over budget: memory");
* caps its CPU time (``RLIMIT_CPU``): before each call the soft limit is set ``call_seconds`` past what it
  used so far (the kernel sends SIGXCPU at it), the hard limit at what is left of ``total_seconds``
  (SIGKILL), the compare's budget for all its replays;
* writes no core file, and answers one JSON line per call: ``{"start": k}`` as call ``k`` begins, then
  ``{"verdict": ...}``.

When the child dies, the call in flight gets a ``not-replayed`` verdict saying why (over budget: CPU time;
the replay crashed: SIGSEGV), and a new child replays the calls after it with what is left of the budget;
the calls before it keep their verdicts. A child that gives no answer within its call's time (plus the
interpreter's start) is killed the same way. Which process owns this decision is the entry point's: the
CLI and the server's workers hand a :class:`ReplayBudget` in (``CompareOptions.replay_budget``); without one
the replay runs in the calling process, as the engine's tests do.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

from parity.shared.errors import DumpError, ParityError
from parity.shared.replay.verdicts import ReplayVerdict, SideReplay, Verdict, verdict_of
from parity.shared.tensor_io import DEFAULT_LIMITS, TensorLimits

__all__ = ["ReplayBudget", "WarmChild", "replay_isolated"]

logger = logging.getLogger(__name__)

#: Seconds a child may take to start (the interpreter, torch's import) before its first answer.
START_SECONDS = 60.0
_CHILD = "parity.shared.replay.sandbox"
_ALLOCATION_FAILED = ("can't allocate memory", "MemoryError", "Cannot allocate memory", "std::bad_alloc")


@dataclass(frozen=True, slots=True)
class ReplayBudget:
    """What the replays of one compare (one rank pair) may spend, in the child that runs them.

    ``memory_bytes``: address space beyond the interpreter's and torch's own; ``call_seconds``: CPU time of
    one call's replay (both sides); ``total_seconds``: CPU time of all of the compare's replays together.
    """

    memory_bytes: int = 2 * 2**30
    call_seconds: float = 60.0
    total_seconds: float = 600.0

    def as_dict(self) -> dict[str, float]:
        return {"memory_bytes": self.memory_bytes, "call_seconds": self.call_seconds,
                "total_seconds": self.total_seconds}  # fmt: skip


# ------------------------------------------------------------------------------------------------------
# verdicts over the pipe: plain JSON, never a pickle (the child reads untrusted dumps)


def _encode(verdict: ReplayVerdict) -> dict[str, Any]:
    def side(s: SideReplay) -> dict[str, Any]:
        return {f.name: getattr(s, f.name) for f in fields(s)}

    out = {f.name: getattr(verdict, f.name) for f in fields(verdict)}
    out.update(verdict=verdict.verdict.value, target=side(verdict.target), bench=side(verdict.bench),
               asked=side(verdict.asked) if verdict.asked is not None else None)  # fmt: skip
    return out


def _decode(doc: Mapping[str, Any]) -> ReplayVerdict:
    values = dict(doc)
    values.update(verdict=Verdict(doc["verdict"]), target=SideReplay(**doc["target"]),
                  bench=SideReplay(**doc["bench"]),
                  asked=SideReplay(**doc["asked"]) if doc.get("asked") else None)  # fmt: skip
    return ReplayVerdict(**values)


def _refused(entry: str, why: str) -> ReplayVerdict:
    direction = "backward" if entry.endswith(".backward") else "forward"
    return verdict_of(entry, direction, SideReplay("target", refusal=why), SideReplay("bench", refusal=why))


# ------------------------------------------------------------------------------------------------------
# the parent


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Child:
    """One child process, its answers read line by line with a deadline for each."""

    def __init__(self, argv: Sequence[str], request: Mapping[str, Any] | None = None) -> None:
        """Start the child; with no ``request`` it imports torch and waits for one (:meth:`send`)."""
        import subprocess

        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - read back when the child fails
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env)  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdout: IO[bytes] = self.proc.stdout
        self._buffer = b""
        self.cpu_seconds = 0.0
        if request is not None:
            self.send(request)

    def send(self, request: Mapping[str, Any]) -> None:
        """Hand the child its one request (it reads its stdin to the end)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: its status says why

    def discard(self) -> None:
        """Kill and reap a child that will get no request."""
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()

    def line(self, timeout: float) -> dict[str, Any] | None:
        """The next answer; None at the end of its output, or when none came within ``timeout`` (the child
        is then killed)."""
        import select

        fd = self.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                self.proc.kill()
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(raw)
        return answer

    def finish(self) -> int:
        """Reap the child: its exit status (negative: the signal), its CPU time noted."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        self.stdout.close()
        return self.proc.returncode

    def last_error(self) -> str:
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        self.stderr.close()
        return lines[-1][:300] if lines else ""


class WarmChild:
    """A replay child started ahead of its request, so that its interpreter start, torch's import and the
    warm-up (about a second or two) run while the compare builds its table, not after it. The first
    ``replay_isolated`` handed it sends it its request; one never used is killed by :meth:`close`."""

    def __init__(self, argv: Sequence[str] | None = None) -> None:
        self._child: _Child | None = _Child(list(argv or [sys.executable, "-m", _CHILD]))

    def take(self) -> _Child | None:
        """The waiting child, once (None after that: a later request starts a fresh one)."""
        child, self._child = self._child, None
        return child

    def close(self) -> None:
        """Kill the child unless a request took it."""
        child = self.take()
        if child is not None:
            child.discard()

    def __enter__(self) -> WarmChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay_isolated(
    npu_dump: str | Path,
    bench_dump: str | Path,
    entries: Sequence[str],
    *,
    budget: ReplayBudget,
    limits: TensorLimits = DEFAULT_LIMITS,
    partners: Mapping[str, str] | None = None,
    asked: Mapping[str, str] | None = None,
    identical: Collection[str] = (),
    argv: Sequence[str] | None = None,
    warm: WarmChild | None = None,
) -> list[ReplayVerdict]:
    """``engine.replay_calls`` in a child process under ``budget`` (see the module docstring): one verdict
    per entry, in order, whatever the child does. Raises ``DumpError`` when a dump.json cannot be read, as
    ``replay_calls`` does. ``argv``: the child's command (tests wrap it); ``warm``: a child already started
    (with the same command), used for the first request."""
    argv = list(argv or [sys.executable, "-m", _CHILD])
    verdicts: list[ReplayVerdict] = []
    pending = list(entries)
    spent = 0.0
    while pending:
        left = budget.total_seconds - spent
        if left <= 0:
            why = f"over budget: the compare's {budget.total_seconds:g} s of replay CPU time are spent"
            verdicts += [_refused(entry, why) for entry in pending]
            break
        request = {"npu_dump": str(npu_dump), "bench_dump": str(bench_dump), "entries": pending,
                   "partners": dict(partners) if partners else None,
                   "asked": {e: asked[e] for e in pending if e in asked} if asked else None,
                   "identical": [e for e in pending if e in identical], "budget": budget.as_dict(),
                   "cpu_left": left, "limits": [limits.max_file_bytes, limits.max_elements]}  # fmt: skip
        waiting = warm.take() if warm is not None else None
        if waiting is not None:
            waiting.send(request)
        child = waiting or _Child(argv, request)
        done, in_flight, failure, timed_out = _collect(child, budget)
        status = child.finish()
        spent += child.cpu_seconds
        verdicts += done
        if failure is not None:  # the request itself is bad: a dump.json that cannot be read
            child.last_error()
            raise DumpError(failure["file"], failure["problem"], where=failure["where"])
        if in_flight is not None:
            why = _death(status, timed_out, budget, spent, child.last_error())
            logger.warning("replay of %s: %s", pending[in_flight], why)
            verdicts.append(_refused(pending[in_flight], why))
            pending = pending[in_flight + 1 :]
            continue
        error = child.last_error()
        if not done:
            why = f"the replay's process failed before it began ({_status_text(status)})"
            raise ParityError(f"{why}: {error}" if error else why)
        pending = pending[len(done) :]  # all done, or it stopped after an error of its own: the rest anew
    return verdicts


def _collect(child: _Child, budget: ReplayBudget
             ) -> tuple[list[ReplayVerdict], int | None, dict[str, Any] | None, bool]:  # fmt: skip
    """Read a child's answers to its end: the verdicts, the call in flight when it ended (None: none),
    the request's failure, and whether it was killed for giving no answer in time."""
    done: list[ReplayVerdict] = []
    in_flight: int | None = None
    wait = START_SECONDS + budget.call_seconds
    try:
        while (answer := child.line(wait)) is not None:
            if "start" in answer:
                in_flight = int(answer["start"])
                wait = 3 * budget.call_seconds + 10  # CPU seconds, on a machine that may be shared
            elif "verdict" in answer:
                done.append(_decode(answer["verdict"]))
                in_flight = None
            elif "failure" in answer:
                return done, None, answer["failure"], False
    except TimeoutError:
        return done, in_flight if in_flight is not None else len(done), None, True
    return done, in_flight, None, False


def _status_text(status: int) -> str:
    return f"killed by {_signal_name(-status)}" if status < 0 else f"exit status {status}"


def _death(status: int, timed_out: bool, budget: ReplayBudget, spent: float, error: str) -> str:
    """Why the call in flight has no verdict, from how its child ended."""
    import signal

    if timed_out:
        return f"over budget: its replay gave no result within {3 * budget.call_seconds + 10:g} s"
    if status == -signal.SIGXCPU:
        return f"over budget: its replay took more than {budget.call_seconds:g} s of CPU time"
    if status == -signal.SIGKILL and spent >= budget.total_seconds - 1:
        return f"over budget: the compare's {budget.total_seconds:g} s of replay CPU time are spent"
    if status < 0:
        return (f"the replay crashed its process ({_signal_name(-status)}, in torch's native code); only "
                "this call's verdict is lost")  # fmt: skip
    return f"the replay's process failed ({_status_text(status)}){': ' + error if error else ''}"


# ------------------------------------------------------------------------------------------------------
# the child


def _vm_bytes() -> int | None:
    """This process's address space now (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cap_memory(memory_bytes: int) -> None:
    import resource

    now = _vm_bytes()
    if now is not None:
        resource.setrlimit(resource.RLIMIT_AS, (now + memory_bytes, now + memory_bytes))


def _cpu_used() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cap_cpu(soft: float, hard: float) -> None:
    import resource

    hard_s = max(math.ceil(hard), 1)
    resource.setrlimit(resource.RLIMIT_CPU, (min(max(math.ceil(soft), 1), hard_s), hard_s))


def _over_memory(verdict: ReplayVerdict, memory_bytes: int) -> ReplayVerdict:
    """A side whose replay failed to allocate is over the memory budget, and says so."""
    why = f"over budget: its replay needs more than the replay's {memory_bytes / 2**30:g} GiB of memory"

    def side(s: SideReplay) -> SideReplay:
        failed = s.refusal is not None and any(marker in s.refusal for marker in _ALLOCATION_FAILED)
        return replace(s, refusal=why) if failed else s

    target, bench = side(verdict.target), side(verdict.bench)
    asked = side(verdict.asked) if verdict.asked is not None else None
    if (target, bench, asked) == (verdict.target, verdict.bench, verdict.asked):
        return verdict
    return verdict_of(verdict.entry, verdict.direction, target, bench, asked=asked,
                      arguments=verdict.arguments, identical=verdict.identical)  # fmt: skip


def _warm_up() -> None:
    """What torch does once per process on its first trace, autograd pass and weights-only load (imports,
    kernel registrations, allocator pools): done before the caps, so that it counts against no call."""
    import io

    import torch
    from parity.shared.replay import cost

    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    cost.trace_backward(torch.add, "add", [x, x], {}, [torch.ones(2, dtype=torch.float64)])
    (x * x).sum().backward()
    buffer = io.BytesIO()
    torch.save(torch.ones(1), buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True)


def _answer(doc: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def child_main() -> int:
    """The child: replay the request's entries one by one, answering on stdout (see the module docstring)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import torch
    from parity.shared.replay.engine import iter_replays

    torch.set_num_threads(1)
    _warm_up()  # before the request: a child started ahead of it (``WarmChild``) has this done when it comes
    request = json.loads(sys.stdin.read())
    budget = ReplayBudget(**request["budget"])
    entries: list[str] = request["entries"]
    try:  # both dump.json files parsed before the caps: the same files the compare itself read
        limits = TensorLimits(*request["limits"])
        replays = iter_replays(request["npu_dump"], request["bench_dump"], entries, limits=limits,
                               partners=request["partners"], asked=request["asked"],
                               identical=frozenset(request["identical"]))  # fmt: skip
    except DumpError as exc:
        _answer({"failure": {"file": exc.file, "problem": exc.problem, "where": exc.where}})
        return 0
    _cap_memory(budget.memory_bytes)
    hard = _cpu_used() + float(request["cpu_left"])
    for k, entry in enumerate(entries):
        _cap_cpu(_cpu_used() + budget.call_seconds, hard)
        _answer({"start": k})
        try:
            verdict = next(replays)
        except (MemoryError, RuntimeError) as exc:  # outside a call's own refusals: this call, then stop
            why = f"the replay failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            _answer({"verdict": _encode(_over_memory(_refused(entry, why), budget.memory_bytes))})
            return 1
        _answer({"verdict": _encode(_over_memory(verdict, budget.memory_bytes))})
    return 0


if __name__ == "__main__":
    raise SystemExit(child_main())
