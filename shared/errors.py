"""The one exception tree of ``parity.shared``: dump format, metrics, compare engine and reports.

Every error names what it is about (a file, an entry, a field) so that a command line can print it as one line
and exit 2, and a server can turn it into a 422, without either of them knowing the details.

    ParityError
     +-- DumpError            a dump or config file is missing, malformed or inconsistent
     |    +-- UnsafeFileError a tensor file that could only be read by running code (pickle) or is too big
     |    +-- TensorTooLargeError  more elements than the cap (its row says so; the compare goes on)
     +-- CompareInputError    the compare request itself is wrong (compare.json, paths, tasks that differ)
     +-- ReportError          a report could not be written
"""

from __future__ import annotations

from pathlib import Path


class ParityError(Exception):
    """Base of every error Parity raises on purpose."""


class DumpError(ParityError):
    """A dump file is missing, malformed, or disagrees with itself.

    ``file`` is the path that holds the problem; ``where`` narrows it down (an entry name, a field, a line and
    column), so the message reads ``dump.json: entry 'Torch.add.0.forward' field 'shape': must be a list``.
    """

    def __init__(self, file: str | Path | None, problem: str, *, where: str | None = None) -> None:
        self.file = str(file) if file is not None else None
        self.problem = problem
        self.where = where
        parts = [p for p in (self.file, where) if p]
        super().__init__(f"{': '.join(parts)}: {problem}" if parts else problem)


class UnsafeFileError(DumpError):
    """A tensor file that is refused without being executed (it needs pickle, or it is over the size cap)."""


class TensorTooLargeError(DumpError):
    """A tensor holds more elements than ``PARITY_MAX_TENSOR_ELEMENTS``: a few bytes on disk can describe a
    broadcast view of 2**40 elements, which would hold a worker for hours. Its row is ``unsupported`` with
    this error's message; the rest of the compare goes on."""


class CompareInputError(ParityError):
    """The compare request is wrong: compare.json, the paths it names, or dumps that cannot be compared."""


class ReportError(ParityError):
    """A report file could not be written."""
