"""The exception tree of ``parity.client``; the CLI prints any of these as one line and exits 2.

ClientError          anything the client raises on purpose
 +-- ConfigError     config.json or a constructor argument is unknown or invalid (names the field)
 +-- CaptureError    the debugger was used in a way it cannot honour (e.g. L0 without a model)
 +-- UploadError     a dump could not be uploaded to, or fetched from, a Parity server
      +-- RunInvalid  the server's validation refused the run's dump (names the file and the entry)
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error ``parity.client`` raises on purpose."""


class ConfigError(ClientError):
    """A config field is unknown or has a value outside its allowed set.

    ``field`` is the dotted field name (``statistics.data_mode``); the message lists what is allowed, so the
    user can fix config.json without reading the docs.
    """

    def __init__(self, field: str, problem: str, *, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}field '{field}': {problem}")


class CaptureError(ClientError):
    """The debugger cannot do what was asked (a model is missing for L0/mix, start before construction)."""


class UploadError(ClientError):
    """Talking to a Parity server failed: unreachable, a request refused, or an unexpected answer."""


class RunInvalid(UploadError):
    """The server's workers validated the uploaded run and refused it: a dump.json does not parse. The
    message is the server's, naming the file and the entry; the run stays on the server as ``invalid``."""
