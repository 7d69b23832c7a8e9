"""The exception tree of ``parity.client`` (created minimally by the uploader work; the client owns it).

    ClientError          anything the client raises on purpose; the CLI prints it as one line, exit 2
     +-- UploadError     a dump could not be uploaded to, or fetched from, a Parity server
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error ``parity.client`` raises on purpose."""


class UploadError(ClientError):
    """Talking to a Parity server failed: unreachable, a request refused, or an unexpected answer."""
