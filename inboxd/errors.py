"""The errors a request can end in, and the one place that maps them to CONTRACT section 3.

::

    InboxError                      anything the API turns into a JSON error body
    ├── InvalidRequest        400   invalid_request
    ├── Unauthorized          401   unauthorized (with WWW-Authenticate: Bearer)
    ├── Forbidden             403   forbidden
    ├── NotFound              404   not_found (and webhook_not_found)
    ├── MethodNotAllowed      405   method_not_allowed
    ├── Conflict              409   status_unchanged, already_blocked, not_blocked
    ├── PayloadTooLarge       413   payload_too_large
    ├── UnsupportedMediaType  415   unsupported_media_type
    ├── Unprocessable         422   assignee_not_allowed, invalid_url, contact_blocked, ...
    ├── RateLimited           429   rate_limited (with Retry-After)
    └── ServiceUnavailable    503   query_timeout (a read ran past the store's read deadline),
                                    writer_stopped (the writer process died under a write),
                                    storage_full, storage_unavailable, storage_busy (a write the
                                    store's disk or files refused; with Retry-After)

The store raises these too, so a rule that lives in SQL (say, "this contact is blocked") reports
itself with the right code without a second check in the route.
"""

from __future__ import annotations

from typing import Any, ClassVar


class InboxError(Exception):
    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal_error"

    retry_after = 0  # seconds; when set, the answer carries Retry-After

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after else {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its class, message and attributes, whatever its constructor takes (the
        # store's writer process sends errors back this way; RateLimited's retry_after is
        # keyword-only, which the default pickling of exceptions cannot rebuild).
        return _rebuild, (type(self), self.args, self.__dict__)

    def body(self) -> dict[str, object]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidRequest(InboxError):
    status = 400
    default_code = "invalid_request"


class Unauthorized(InboxError):
    status = 401
    default_code = "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="inboxd"'}


class Forbidden(InboxError):
    status = 403
    default_code = "forbidden"


class NotFound(InboxError):
    status = 404
    default_code = "not_found"


class MethodNotAllowed(InboxError):
    status = 405
    default_code = "method_not_allowed"


class Conflict(InboxError):
    status = 409
    default_code = "conflict"


class PayloadTooLarge(InboxError):
    status = 413
    default_code = "payload_too_large"


class UnsupportedMediaType(InboxError):
    status = 415
    default_code = "unsupported_media_type"


class Unprocessable(InboxError):
    status = 422
    default_code = "unprocessable"


class ServiceUnavailable(InboxError):
    status = 503
    default_code = "unavailable"

    def __init__(self, message: str, *, code: str | None = None, retry_after: int = 0) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class StorageUnavailable(ServiceUnavailable):
    """The store's disk or files refused a write (store/db.py, StorageAlarm): the store has
    logged why, so its callers need not log it again."""


class RateLimited(InboxError):
    status = 429
    default_code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreError(Exception):
    """A problem with the data directory itself (missing, newer schema, not a store)."""


def _rebuild(cls: type[InboxError], args: tuple[Any, ...], state: dict[str, Any]) -> InboxError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error
