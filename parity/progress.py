"""A one-line progress bar on stderr for long compares, with no dependency.

It draws only when it helps: on a terminal, or (when stderr is a file or a pipe, as in CI logs) for compares
large enough to take a while, and then as a few plain lines rather than carriage-return redraws. Redraws are
throttled, so the engine may call it for every row.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Below this many units (rows or bytes, whatever the engine counts) a non-terminal gets no progress lines.
MANY_UNITS = 50_000


class ProgressBar:
    """``bar(done, total)`` draws ``[#####.....]  52%  31,200/60,000  4.1 s`` on ``stream``."""

    def __init__(
        self,
        label: str = "compare",
        *,
        stream: TextIO | None = None,
        min_interval: float = 0.2,
        width: int = 30,
        force: bool | None = None,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval = min_interval
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.force = force
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._last_percent_logged = -1
        self._finished = False
        self._line_open = False  # a terminal line drawn without its newline yet

    def enabled_for(self, total: int) -> bool:
        """Whether a compare of ``total`` units shows progress on this stream."""
        if self.force is not None:
            return self.force
        return self.tty or total >= MANY_UNITS

    def __call__(self, done: int, total: int) -> None:
        if self._finished or total <= 0 or not self.enabled_for(total):
            return
        now = time.monotonic()
        finished = done >= total
        if not finished and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        fraction = min(max(done / total, 0.0), 1.0)
        percent = int(fraction * 100)
        if self.tty:
            filled = int(fraction * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            line = f"\r{self.label} [{bar}] {percent:3d}%  {done:,}/{total:,}  {now - self._started:.1f} s"
            self.stream.write(line + ("\n" if finished else ""))
            self._line_open = not finished
        else:
            # A log file gets one line per 10% (and the last), not hundreds of redraws.
            step = percent // 10 * 10
            if step <= self._last_percent_logged and not finished:
                return
            self._last_percent_logged = 100 if finished else step
            self.stream.write(f"{self.label}: {100 if finished else step}% ({done:,}/{total:,})\n")
        self._finished = finished
        self.stream.flush()

    def close(self) -> None:
        """End a half-drawn terminal line so the next output starts on its own line."""
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
            self.stream.flush()
