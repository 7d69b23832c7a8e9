"""The server's error tree: services raise these, one handler in ``main.py`` turns them into responses.

Every message is one line naming the run, file, field or comparison it is about, so that the client can show
it verbatim (``{"detail": "..."}``).

    ServiceError (400)
     +-- BadRequest (400)
     +-- Unauthorized (401)
     +-- Forbidden (403)
     +-- NotFound (404)
     +-- Conflict (409)
     +-- PayloadTooLarge (413)
     +-- Unprocessable (422)
     +-- TooManyRequests (429)  too many wrong tokens from one address: ``retry_after`` seconds to wait
     +-- StoreError (500)    the blob store failed (disk, S3)
     +-- InsufficientStorage (507)  the disk or the database is full: free space by deleting runs
     +-- ConfigError         a setting is invalid: the server refuses to start
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the server reports on purpose; ``status_code`` is the HTTP status it maps to."""

    status_code = 400

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code


class BadRequest(ServiceError):
    status_code = 400


class Unauthorized(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class PayloadTooLarge(ServiceError):
    status_code = 413


class Unprocessable(ServiceError):
    status_code = 422


class TooManyRequests(ServiceError):
    status_code = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreError(ServiceError):
    status_code = 500


class InsufficientStorage(ServiceError):
    status_code = 507


class ConfigError(ServiceError):
    """A ``PARITY_*`` setting the server cannot run with; raised before it starts, never as a response."""

    status_code = 500
