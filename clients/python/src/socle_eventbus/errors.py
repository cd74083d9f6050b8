"""Typed exceptions, mapped from gRPC status codes in one place (`from_rpc_error`)."""

from __future__ import annotations

from typing import Optional

import grpc


class EventBusError(Exception):
    """Base of every error this package raises. `code` is the gRPC status code, if any."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Unauthenticated(EventBusError):
    """Missing, malformed, unknown or expired credentials (UNAUTHENTICATED)."""


class PermissionDenied(EventBusError):
    """The principal lacks a right for this operation or channel (PERMISSION_DENIED)."""


class NotFound(EventBusError):
    """Unknown consumer or subscription (NOT_FOUND)."""


class AlreadyExists(EventBusError):
    """A consumer exists with a different configuration (ALREADY_EXISTS)."""


class InvalidArgument(EventBusError):
    """Bad channel, pattern, metadata or option (INVALID_ARGUMENT)."""


class Unavailable(EventBusError):
    """The broker cannot be reached or is shutting down (UNAVAILABLE)."""


class ResourceExhausted(EventBusError):
    """Payload too large, slow consumer, or a per-principal limit (RESOURCE_EXHAUSTED)."""


_BY_CODE = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


def from_rpc_error(err: grpc.RpcError) -> EventBusError:
    """The typed exception for a failed call (EventBusError for codes without a subclass)."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    message = f"{code.name if code else 'UNKNOWN'}: {details or ''}".rstrip(": ")
    return _BY_CODE.get(code, EventBusError)(message, code)  # type: ignore[arg-type]


def from_status(code: int, message: str) -> EventBusError:
    """The typed exception for a status given as numbers (a `PublishError` of a batch)."""
    status = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(status, EventBusError)(f"{status.name}: {message}".rstrip(": "), status)


def is_transient(err: BaseException) -> bool:
    """Errors worth reconnecting for: the broker went away or restarts."""
    if isinstance(err, Unavailable):
        return True
    if isinstance(err, EventBusError):
        return err.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED,
                            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED)
    return isinstance(err, (ConnectionError, OSError))
