"""The float64 replay's child process (``parity.shared.replay.sandbox``), crashing with SIGSEGV as it replays
an entry named in ``PARITY_TEST_CRASH_ON`` (comma-separated): what a native kernel reading past a tensor
does to the process, made certain. ``python -m tests.replay_crash_child`` takes the sandbox's request."""

from __future__ import annotations

import os
import signal
from typing import Any

from parity.shared.replay import engine, sandbox

_CRASH_ON = set(filter(None, os.environ.get("PARITY_TEST_CRASH_ON", "").split(",")))
_replay_side = engine.replay_side


def _crashing(side: engine.DumpSide, entry: str, **kwargs: Any) -> engine.SideReplay:
    if entry in _CRASH_ON:
        os.kill(os.getpid(), signal.SIGSEGV)
    return _replay_side(side, entry, **kwargs)


engine.replay_side = _crashing  # type: ignore[assignment]

if __name__ == "__main__":
    raise SystemExit(sandbox.child_main())
