"""The exceptions shmtensor raises.

Every error is a ``shmtensor.Error``; the subclasses say what went wrong, and
each also derives from the matching built-in exception where there is one,
so ``except KeyError`` or ``except TimeoutError`` work as expected::

    Error
    ├── InvalidArgumentError (ValueError)   bad input; the message names it
    │   └── LargerThanPoolError             bigger than the whole pool
    ├── NotFoundError (KeyError)            no such name, pool or lease
    │   └── StaleReferenceError             the ref's object is gone
    ├── AlreadyExistsError                  the name is bound already
    ├── PreconditionError                   wrong state (sealed twice, ...)
    │   └── AlreadyTakenError               exclusive ref taken already
    ├── PermissionDeniedError (PermissionError)  another client's lease
    ├── PoolExhaustedError (MemoryError)    pool full after the timeout
    ├── LimitExceededError                  an operator's limit (sessions,
    │                                       leases, bytes per client/user)
    ├── TimeoutError (TimeoutError)         a wait ran out (named get)
    └── DaemonUnavailableError (ConnectionError)  no daemon, or it stopped
"""

import builtins as _builtins

__all__ = [
    "Error", "InvalidArgumentError", "LargerThanPoolError", "NotFoundError", "StaleReferenceError",
    "AlreadyExistsError", "PreconditionError", "AlreadyTakenError",
    "PermissionDeniedError", "PoolExhaustedError", "LimitExceededError",
    "TimeoutError",
    "DaemonUnavailableError", "from_status",
]


class Error(Exception):
    """Base of every shmtensor error. ``code`` is the gRPC status code name,
    ``reason`` the ErrorReason name where the daemon gave one."""

    def __init__(self, message, code="UNKNOWN", reason=""):
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason

    def __str__(self):
        return self.message


class InvalidArgumentError(Error, ValueError):
    """The request was malformed; the message names the value at fault."""


class LargerThanPoolError(InvalidArgumentError):
    """The size asked for exceeds the whole pool: no wait and no free can make
    room; only a larger pool (or a smaller object) can."""


class NotFoundError(Error, KeyError):
    """No object of that name, no such pool or lease."""

    def __str__(self):  # KeyError would quote the message.
        return self.message


class StaleReferenceError(NotFoundError):
    """The ref names an object that is gone (or of an earlier daemon)."""


class AlreadyExistsError(Error):
    """The name is bound to another object already."""


class PreconditionError(Error):
    """The object or session is not in a state that allows the call."""


class AlreadyTakenError(PreconditionError):
    """An exclusive ref was taken by another consumer already."""


class PermissionDeniedError(Error, PermissionError):
    """The lease belongs to another client."""


class PoolExhaustedError(Error, MemoryError):
    """The pool stayed full for the whole timeout; the message names the
    pool, the size asked, the bytes free and the clients holding the most."""


class LimitExceededError(Error):
    """A limit the daemon's operator set would be passed (its [limits]:
    sessions, leases or bytes per client or per user, waiting calls, live
    objects); the message names it. Not a full pool: release what this
    client or user holds, or ask for a higher limit."""


class TimeoutError(Error, _builtins.TimeoutError):  # noqa: A001
    """A wait (for a named object to be sealed) ran out."""


class DaemonUnavailableError(Error, ConnectionError):
    """No daemon answers at the address, or it is shutting down."""


# absl::StatusCode values.
_CODES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}

_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "OUT_OF_RANGE": InvalidArgumentError,
    "NOT_FOUND": NotFoundError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "FAILED_PRECONDITION": PreconditionError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "RESOURCE_EXHAUSTED": PoolExhaustedError,
    "DEADLINE_EXCEEDED": TimeoutError,
    "UNAVAILABLE": DaemonUnavailableError,
}

# One class per reason of the C++ table (shmtensor/errors.h); test_errors.py
# checks that every reason the table has is here.
_BY_REASON = {
    "ERROR_REASON_STALE_REFERENCE": StaleReferenceError,
    "ERROR_REASON_ALREADY_TAKEN": AlreadyTakenError,
    "ERROR_REASON_SESSION_ENDED": DaemonUnavailableError,
    "ERROR_REASON_LARGER_THAN_POOL": LargerThanPoolError,
    "ERROR_REASON_LIMIT_EXCEEDED": LimitExceededError,
}


def from_status(code, reason, message):
    """The exception for an absl::Status (used by the C++ binding)."""
    name = _CODES.get(code, "UNKNOWN")
    cls = _BY_REASON.get(reason) or _BY_CODE.get(name, Error)
    return cls(message, name, reason)
