// OpenTelemetry, through its API only (the application registers the SDK and exporter).
//
// A publish runs in a `send <channel>` span (kind PRODUCER) whose context the event
// carries as W3C `traceparent` / `tracestate` in its metadata (unless the caller put a
// `traceparent` there); the Worker runs each handler in a `process <channel>` span (kind
// CONSUMER), active while the handler runs, whose parent is that context. The broker
// reads W3C Trace Context only, so the context is written in that format whatever
// propagator the application registered. Without an SDK the API's spans record nothing
// and carry the caller's context on, if there is one: nothing else is added to events.
import {
  type Attributes,
  type Context,
  type Span,
  type SpanContext,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context,
  createTraceState,
  isSpanContextValid,
  trace,
} from "@opentelemetry/api";

import type { Event, PublishRequest, PublishResponse } from "./gen/eventbus/v1/eventbus.js";
import type { Delivery } from "./worker.js";

const tracer = trace.getTracer("@socle/eventbus", "0.1.0");
const TRACEPARENT = "traceparent";
const TRACESTATE = "tracestate";
const W3C = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** Starts the `send` span of publishing `request`, and puts its context in the request's
 * metadata unless the caller gave one. */
export function startSend(request: PublishRequest): Span {
  const span = tracer.startSpan(`send ${request.channel}`, { kind: SpanKind.PRODUCER });
  if (span.isRecording()) {
    span.setAttributes({
      "messaging.system": "eventbus",
      "messaging.operation.type": "send",
      "messaging.operation.name": "publish",
      "messaging.destination.name": request.channel,
      "messaging.message.body.size": request.payload.length,
    });
  }
  if (request.metadata[TRACEPARENT] === undefined) inject(span.spanContext(), request.metadata);
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

/** Publishes `request` with `send` inside its `send` span. */
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
    endSend(span, err instanceof Error ? err : new Error(String(err)));
    throw err;
  }
}

/** The caller's active context as W3C headers (empty without one), for the events of a
 * publish stream. */
export function activeCarrier(): Record<string, string> {
  const carrier: Record<string, string> = {};
  const span = trace.getSpan(context.active());
  if (span !== undefined) inject(span.spanContext(), carrier);
  return carrier;
}

/** The `process` span of handling `delivery` for `consumer`, a child of the publisher's
 * context when the event carries one; `run` is called with the span active. */
export function processing<T>(consumer: string, delivery: Delivery, run: () => T): { span: Span; result: T } {
  const event = delivery.event;
  const parent = extract(event) ?? ROOT_CONTEXT;
  const span = tracer.startSpan(`process ${event.channel}`, { kind: SpanKind.CONSUMER }, parent);
  if (span.isRecording()) {
    const attributes: Attributes = {
      "messaging.system": "eventbus",
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.destination.name": event.channel,
      "messaging.consumer.group.name": consumer,
      "messaging.message.id": event.id,
      "messaging.message.body.size": event.payload.length,
      "messaging.eventbus.attempt": delivery.attempt,
    };
    span.setAttributes(attributes);
  }
  const result = context.with(trace.setSpan(parent, span), run);
  return { span, result };
}

/** Records a handler's outcome (`ack`, `retry`, `term`) on its `process` span and ends it. */
export function processed(span: Span, outcome: "ack" | "retry" | "term", err: unknown): void {
  if (span.isRecording()) {
    span.setAttribute("messaging.eventbus.outcome", outcome);
    if (err instanceof Error) span.recordException(err);
    if (outcome !== "ack") {
      const message = err instanceof Error ? `${err.name}: ${err.message}` : err === undefined ? outcome : String(err);
      span.setStatus({ code: SpanStatusCode.ERROR, message });
    }
  }
  span.end();
}

function inject(sc: SpanContext, metadata: Record<string, string>): void {
  if (!isSpanContextValid(sc)) return;
  const flags = (sc.traceFlags & 1).toString(16).padStart(2, "0");
  metadata[TRACEPARENT] = `00-${sc.traceId}-${sc.spanId}-${flags}`;
  const state = sc.traceState?.serialize();
  if (state) metadata[TRACESTATE] = state;
}

function extract(event: Event): Context | undefined {
  const match = W3C.exec(event.metadata[TRACEPARENT]?.trim() ?? "");
  if (match === null) return undefined;
  const [, version, traceId, spanId, flags, rest] = match;
  if (version === "ff" || (version === "00" && rest !== undefined)) return undefined;
  const state = event.metadata[TRACESTATE];
  const sc: SpanContext = {
    traceId: traceId!,
    spanId: spanId!,
    traceFlags: parseInt(flags!, 16) & 1,
    isRemote: true,
    traceState: state ? createTraceState(state) : undefined,
  };
  return isSpanContextValid(sc) ? trace.setSpanContext(ROOT_CONTEXT, sc) : undefined;
}
