// OpenTelemetry, through its API only (the application registers the SDK, its propagator
// and its exporter).
//
// A publish (each event of a batch or a stream too) runs in a `send <channel>` span (kind
// PRODUCER) whose context the global propagator writes into the event's metadata (unless
// the caller put a `traceparent` there); the Worker runs each handler in a
// `process <channel>` span (kind CONSUMER), active while the handler runs, whose parent is
// the context the global propagator reads back from the delivered event's metadata.
// eventbusd itself reads W3C Trace Context (`traceparent` / `tracestate`), the SDK's
// default propagator. Without a registered SDK the spans record nothing, and an event
// carries at most a context the caller already had active.
import {
  type Context,
  type Span,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context,
  isSpanContextValid,
  propagation,
  trace,
} from "@opentelemetry/api";

import type { PublishRequest, PublishResponse } from "./gen/eventbus/v1/eventbus.js";
import type { Delivery } from "./worker.js";

/** The package's version, as its tracer names it. */
const VERSION = "0.1.0";

const tracer = trace.getTracer("@socle/eventbus", VERSION);
const TRACEPARENT = "traceparent";

/** What the Worker did with a delivery, as its `process` span names it. */
export type ProcessOutcome = "ack" | "retry" | "term";

/** Starts the `send` span of publishing `request` (a child of `parent`, by default the
 * active context), and puts its context in the request's metadata unless the caller gave
 * a `traceparent`. */
export function startSend(request: PublishRequest, parent: Context = context.active()): Span {
  const span = tracer.startSpan(`send ${request.channel}`, { kind: SpanKind.PRODUCER }, parent);
  if (span.isRecording()) {
    span.setAttributes({
      "messaging.system": "eventbus",
      "messaging.destination.name": request.channel,
      "messaging.operation.type": "send",
      "messaging.operation.name": "publish",
      "messaging.message.body.size": request.payload.length,
    });
  }
  // Without an SDK the span carries no valid context (nor does the caller's): nothing to
  // write, and no context is made for it.
  if (request.metadata[TRACEPARENT] === undefined && isSpanContextValid(span.spanContext())) {
    propagation.inject(trace.setSpan(parent, span), request.metadata);
  }
  return span;
}

/** Ends a `send` span with the broker's answer, or the error the call failed with. */
export function endSend(span: Span, answer: PublishResponse | Error | undefined): void {
  if (span.isRecording()) {
    if (answer instanceof Error) {
      span.recordException(answer);
      span.setStatus({ code: SpanStatusCode.ERROR, message: `${answer.name}: ${answer.message}` });
    } else if (answer !== undefined) {
      span.setAttribute("messaging.message.id", answer.eventId);
    }
  }
  span.end();
}

/** Publishes `request` with `send`, inside its `send` span. */
export async function traced(
  request: PublishRequest,
  send: (request: PublishRequest) => Promise<PublishResponse>,
): Promise<PublishResponse> {
  const span = startSend(request);
  try {
    const answer = await send(request);
    endSend(span, answer);
    return answer;
  } catch (err) {
    endSend(span, asError(err));
    throw err;
  }
}

/**
 * The `send` spans of a publish stream's events: each event runs in a span of its own, a
 * child of the context active when the stream was made, ended when the broker answers
 * for it (its response, its refusal, or the totals that cover it) or when the stream
 * fails or is closed first. Only recording spans are kept (without an SDK, nothing is).
 */
export class StreamSends {
  /** Recording spans not answered yet, by position in the stream, oldest first. */
  private readonly open: Array<{ position: number; span: Span }> = [];
  /** Position of the next request. */
  private sent = 0;
  /** Responses of mode `each` so far: the position the next one answers. */
  private responses = 0;

  constructor(private readonly parent: Context = context.active()) {}

  /** Starts the span of the stream's next request and puts its context in the request. */
  start(request: PublishRequest): void {
    const position = this.sent++;
    const span = startSend(request, this.parent);
    if (span.isRecording()) this.open.push({ position, span });
  }

  /** The broker's response to the oldest request (mode `each`). */
  answered(response: PublishResponse): void {
    const position = this.responses++;
    if (this.open[0]?.position === position) endSend(this.open.shift()!.span, response);
  }

  /** The request at `position` was refused. */
  refused(position: number, err: Error): void {
    const i = this.open.findIndex((o) => o.position === position);
    if (i >= 0) endSend(this.open.splice(i, 1)[0]!.span, err);
  }

  /** The first `count` requests are answered (running totals of modes `cumulative`, `none`). */
  covered(count: number): void {
    while (this.open.length > 0 && this.open[0]!.position < count) endSend(this.open.shift()!.span, undefined);
  }

  /** Whether a span is still open. */
  get unanswered(): boolean {
    return this.open.length > 0;
  }

  /** Ends every span still open with `err`: the stream failed, or was closed first. */
  failed(err: Error): void {
    for (const { span } of this.open.splice(0)) endSend(span, err);
  }
}

/** The `process` span of handling `delivery` for `consumer`, a child of the context the
 * event carries (a root span without one); `run` is called with the span active. */
export function processing<T>(consumer: string, delivery: Delivery, run: () => T): { span: Span; result: T } {
  const event = delivery.event;
  const parent = propagation.extract(ROOT_CONTEXT, event.metadata);
  const span = tracer.startSpan(`process ${event.channel}`, { kind: SpanKind.CONSUMER }, parent);
  if (span.isRecording()) {
    span.setAttributes({
      "messaging.system": "eventbus",
      "messaging.destination.name": event.channel,
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.consumer.group.name": consumer,
      "messaging.message.id": event.id,
      "messaging.message.body.size": event.payload.length,
      "messaging.eventbus.attempt": delivery.attempt,
    });
  }
  // Without an SDK (nor a context in the event) there is nothing to make active.
  if (!isSpanContextValid(span.spanContext())) return { span, result: run() };
  return { span, result: context.with(trace.setSpan(parent, span), run) };
}

/** Records what the Worker did with a delivery on its `process` span, and ends it.
 * `failure` is the handler's error (recorded as an exception), or the reason of a `term`
 * or a requested retry; anything but an ack has status error. */
export function processed(span: Span, outcome: ProcessOutcome, failure?: Error | string): void {
  if (span.isRecording()) {
    span.setAttribute("messaging.eventbus.outcome", outcome);
    if (failure instanceof Error) span.recordException(failure);
    if (outcome !== "ack") {
      const message = failure instanceof Error ? `${failure.name}: ${failure.message}` : failure || outcome;
      span.setStatus({ code: SpanStatusCode.ERROR, message });
    }
  }
  span.end();
}

/** `err` as an `Error` (a thrown non-error becomes one with its text as the message). */
export function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}
