// Typed errors, mapped from gRPC status codes in one place (`fromServiceError`).
import { status as Status, type ServiceError } from "@grpc/grpc-js";

/** Base of every error this package raises. `code` is the gRPC status code, if any. */
export class EventBusError extends Error {
  /** The gRPC status code (`status` of `@grpc/grpc-js`), undefined for a client-side failure. */
  readonly code: Status | undefined;
  /** The status message as the broker sent it (it names the problem). */
  readonly details: string;

  constructor(message: string, code?: Status, details?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.details = details ?? message;
  }

  override get name(): string {
    return this.constructor.name;
  }
}

/** Missing, malformed, unknown or expired credentials (UNAUTHENTICATED). */
export class Unauthenticated extends EventBusError {}
/** The principal lacks a right for this operation or channel (PERMISSION_DENIED). */
export class PermissionDenied extends EventBusError {}
/** Unknown consumer, subscription or channel history (NOT_FOUND). */
export class NotFound extends EventBusError {}
/** A consumer exists with a different configuration (ALREADY_EXISTS). */
export class AlreadyExists extends EventBusError {}
/** Bad channel, pattern, metadata or option (INVALID_ARGUMENT). */
export class InvalidArgument extends EventBusError {}
/** Payload too large, slow consumer, or a per-principal limit (RESOURCE_EXHAUSTED). */
export class ResourceExhausted extends EventBusError {}
/** The broker cannot be reached or is shutting down (UNAVAILABLE). */
export class Unavailable extends EventBusError {}
/** The call's deadline passed before it was answered (DEADLINE_EXCEEDED). */
export class DeadlineExceeded extends EventBusError {}
/** The operation is not allowed in the current state (FAILED_PRECONDITION). */
export class FailedPrecondition extends EventBusError {}
/** The call was cancelled (CANCELLED). */
export class Cancelled extends EventBusError {}
/** The broker failed (INTERNAL). */
export class Internal extends EventBusError {}

const BY_CODE: ReadonlyMap<number, new (message: string, code?: Status, details?: string) => EventBusError> = new Map<
  number,
  new (message: string, code?: Status, details?: string) => EventBusError
>([
  [Status.UNAUTHENTICATED, Unauthenticated],
  [Status.PERMISSION_DENIED, PermissionDenied],
  [Status.NOT_FOUND, NotFound],
  [Status.ALREADY_EXISTS, AlreadyExists],
  [Status.INVALID_ARGUMENT, InvalidArgument],
  [Status.RESOURCE_EXHAUSTED, ResourceExhausted],
  [Status.UNAVAILABLE, Unavailable],
  [Status.DEADLINE_EXCEEDED, DeadlineExceeded],
  [Status.FAILED_PRECONDITION, FailedPrecondition],
  [Status.CANCELLED, Cancelled],
  [Status.INTERNAL, Internal],
]);

/** The status name of a code: `INVALID_ARGUMENT`, `UNKNOWN`... */
export function statusName(code: number): string {
  return (Status as unknown as Record<number, string>)[code] ?? "UNKNOWN";
}

/** The typed error for a status given as numbers (the `PublishError` of a refused event). */
export function fromStatus(code: number, details: string): EventBusError {
  const name = statusName(code);
  const Ctor = BY_CODE.get(code) ?? EventBusError;
  return new Ctor(details ? `${name}: ${details}` : name, code as Status, details);
}

function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === "number" && "details" in err;
}

/** The typed error for a failed call; an `EventBusError` is returned as is. */
export function fromServiceError(err: unknown): EventBusError {
  if (err instanceof EventBusError) return err;
  if (isServiceError(err)) {
    const typed = fromStatus(err.code, err.details);
    (typed as { cause?: unknown }).cause = err;
    return typed;
  }
  const message = err instanceof Error ? err.message : String(err);
  return new EventBusError(message, undefined, message, { cause: err });
}

/** Errors worth reconnecting for: the broker went away, restarts or dropped the connection. */
export function isTransient(err: unknown): boolean {
  if (err instanceof Unavailable) return true;
  if (err instanceof EventBusError) {
    return (
      err.code === Status.UNKNOWN ||
      err.code === Status.INTERNAL ||
      err.code === Status.CANCELLED ||
      err.code === Status.DEADLINE_EXCEEDED ||
      err.code === Status.ABORTED
    );
  }
  return false;
}
