"""A one-line progress bar on stderr for long compares and uploads, with no dependency.

It draws only when it helps: on a terminal, or (when stderr is a file or a pipe, as in CI logs) for compares
large enough to take a while, and then as a few plain lines rather than carriage-return redraws. Redraws are
throttled, so the engine may call it for every row.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

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
        describe: Callable[[int, int], str] | None = None,
    ) -> None:
        self.label = label
        # What follows the percentage, from (done, total); by default the counts (and on a terminal the time).
        self.describe = describe
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
            elapsed = f"{now - self._started:.1f} s"
            detail = self.describe(done, total) if self.describe else f"{done:,}/{total:,}  {elapsed}"
            line = f"\r{self.label} [{bar}] {percent:3d}%  {detail}"
            self.stream.write(line + ("\n" if finished else ""))
            self._line_open = not finished
        else:
            # A log file gets one line per 10% (and the last), not hundreds of redraws.
            step = percent // 10 * 10
            if step <= self._last_percent_logged and not finished:
                return
            self._last_percent_logged = 100 if finished else step
            detail = self.describe(done, total) if self.describe else f"{done:,}/{total:,}"
            self.stream.write(f"{self.label}: {100 if finished else step}% ({detail})\n")
        self._finished = finished
        self.stream.flush()

    def close(self) -> None:
        """End a half-drawn terminal line so the next output starts on its own line."""
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
            self.stream.flush()


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class TransferState(Protocol):
    """How far a transfer of many files is (``parity.commands.upload.UploadProgress``); read-only."""

    @property
    def files_done(self) -> int: ...
    @property
    def files_total(self) -> int: ...
    @property
    def bytes_done(self) -> int: ...
    @property
    def bytes_total(self) -> int: ...
    @property
    def bytes_sent(self) -> int: ...  # of bytes_done, those sent now (the rest were there already)
    @property
    def elapsed_s(self) -> float: ...


class TransferProgress:
    """The progress of an upload of many files as a :class:`ProgressBar` over its bytes.

    Called with a :class:`TransferState` after each file (the uploader's ``on_progress``, which calls it
    under its lock). ``quiet`` shows nothing; otherwise the bar shows on a terminal, and elsewhere (a CI log)
    as one plain line per tenth of the bytes. Files already on the server count as done, not in the rate.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.quiet = quiet
        self.bar = ProgressBar(label, stream=stream, force=True, describe=self._describe)
        self._state: TransferState | None = None

    def __call__(self, state: TransferState) -> None:
        if self.quiet:
            return
        self._state = state
        if state.bytes_total:
            self.bar(state.bytes_done, state.bytes_total)
        else:  # nothing but empty files: count files
            self.bar(state.files_done, state.files_total)

    def close(self) -> None:
        self.bar.close()

    def _describe(self, _done: int, _total: int) -> str:
        """``312/636 files, 1.2/2.5 GB, 45.3 MB/s``: files and bytes, and the rate of what was sent."""
        s = self._state
        assert s is not None  # the bar draws only from __call__
        rate = s.bytes_sent / max(s.elapsed_s, 1e-9)
        done = f"{_size(s.bytes_done)}/{_size(s.bytes_total)}"
        return f"{s.files_done}/{s.files_total} files, {done}, {_size(rate)}/s"
