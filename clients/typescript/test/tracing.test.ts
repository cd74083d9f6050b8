// Tracing: the client's spans, kept in memory by the SDK this file registers as an
// application registers its own (a tracer provider, the W3C Trace Context propagator and
// the AsyncLocalStorage context manager), the trace context events carry, and eventbusd's
// spans (sent to the test OTLP receiver, `otlp-receiver`): one trace from the publisher's
// span through the broker to the worker's handler.
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";

import { type Span, SpanKind, SpanStatusCode, context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";

import {
  Ack,
  Client,
  EventBusError,
  Retry,
  Term,
  Worker,
  type Delivery,
  type Event,
  type Outcome,
  PublishRefused,
  type PublishResponse,
  type Subscription,
} from "@socle/eventbus";

import { Daemon, REPO, deferred, eventually, take, uniqueName, within } from "./helpers.js";

const T = { timeout: 90_000 };
const RECEIVER = process.env.EVENTBUS_OTLP_RECEIVER ?? join(REPO, "target", "debug", "otlp-receiver");

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
propagation.setGlobalPropagator(new W3CTraceContextPropagator());
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const app = trace.getTracer("app");

/** The finished spans called `name` (each test has channels of its own). */
const named = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);

/** The one finished span called `name`. */
function one(name: string): ReadableSpan {
  const spans = named(name);
  assert.equal(spans.length, 1, `one span ${name}, got ${spans.length}`);
  return spans[0]!;
}

/** A span's context as the W3C propagator writes it. */
function traceparent(span: ReadableSpan | Span): string {
  const sc = span.spanContext();
  return `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}`;
}

/** `fn` inside a fresh application span (ended after it). */
async function inSpan<T>(name: string, fn: (span: Span) => Promise<T>): Promise<[Span, T]> {
  const span = app.startSpan(name);
  try {
    return [span, await context.with(trace.setSpan(context.active(), span), () => fn(span))];
  } finally {
    span.end();
  }
}

/** The `process` spans of `channel`, by attempt. */
function processes(channel: string): ReadableSpan[] {
  const attempt = (s: ReadableSpan): number => Number(s.attributes["messaging.eventbus.attempt"]);
  return named(`process ${channel}`).sort((a, b) => attempt(a) - attempt(b));
}

async function events(sub: Subscription, count: number): Promise<Event[]> {
  return (await take(sub, count)) as Event[];
}

/** Runs a Worker on `consumer` until `handle` has resolved `done`, then stops it. */
async function work(
  client: Client,
  consumer: string,
  handle: (d: Delivery, done: () => void) => Outcome | Promise<Outcome>,
): Promise<void> {
  const finished = deferred();
  const worker = new Worker(client, consumer, (d) => handle(d, finished.resolve));
  await worker.start();
  try {
    await within(finished.promise, 20_000, "the handler");
  } finally {
    await worker.stop();
  }
}

interface BrokerSpan {
  service: string;
  name: string;
  trace_id: string;
  span_id: string;
  parent_span_id: string;
  attributes: Record<string, string>;
}

/** The test OTLP receiver process, and the spans it printed. */
class Receiver {
  readonly spans: BrokerSpan[] = [];
  private constructor(
    private readonly proc: ChildProcess,
    readonly endpoint: string,
  ) {}

  static async start(): Promise<Receiver> {
    assert.ok(existsSync(RECEIVER), `${RECEIVER} not found: cargo build -p eventbus-testkit --bin otlp-receiver`);
    const proc = spawn(RECEIVER, [], { stdio: ["pipe", "pipe", "inherit"] });
    const lines = createInterface({ input: proc.stdout! });
    const first = deferred<string>();
    let receiver: Receiver | undefined;
    lines.on("line", (line) => {
      if (receiver === undefined) first.resolve(line);
      else receiver.spans.push(JSON.parse(line) as BrokerSpan);
    });
    const [word, endpoint] = (await within(first.promise, 10_000, "the receiver's address")).split(" ");
    assert.equal(word, "listening");
    receiver = new Receiver(proc, endpoint!);
    return receiver;
  }

  named(name: string, traceId: string): BrokerSpan[] {
    return this.spans.filter((s) => s.name === name && s.trace_id === traceId);
  }

  stop(): void {
    this.proc.kill("SIGKILL");
  }
}

describe("tracing", () => {
  let receiver: Receiver;
  let daemon: Daemon;
  let client: Client;

  before(async () => {
    receiver = await Receiver.start();
    daemon = await Daemon.start({
      EVENTBUS__TELEMETRY__OTLP__ENDPOINT: receiver.endpoint,
      EVENTBUS__TELEMETRY__OTLP__EXPORT_INTERVAL_MS: "20",
    });
    client = await Client.connect(daemon.url);
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
    receiver?.stop();
  });

  it("a publish runs in a send span whose context subscribers receive", T, async () => {
    const name = uniqueName();
    const unary = await Client.connect(daemon.url, { unaryPublish: true });
    const sub = client.subscribe(`${name}.>`);
    try {
      await sub.started();
      const [checkout, answers] = await inSpan("checkout", async () => [
        await client.publish(`${name}.shared`, "42"), // the shared PublishStream
        await unary.publish(`${name}.unary`, "4242"), // one unary Publish call
      ]);
      const received = await events(sub, 2);
      for (const [i, how] of ["shared", "unary"].entries()) {
        const channel = `${name}.${how}`;
        const send = one(`send ${channel}`);
        const event = received.find((e) => e.channel === channel)!;
        assert.equal(event.id, answers[i]!.eventId);
        assert.equal(event.metadata.traceparent, traceparent(send), `${how}: the event carries its send span`);
        assert.equal(send.spanContext().traceId, checkout.spanContext().traceId, `${how}: the application's trace`);
        assert.equal(send.parentSpanContext?.spanId, checkout.spanContext().spanId, `${how}: a child of the caller's span`);
        assert.equal(send.kind, SpanKind.PRODUCER);
        assert.deepEqual(send.attributes, {
          "messaging.system": "eventbus",
          "messaging.destination.name": channel,
          "messaging.operation.type": "send",
          "messaging.operation.name": "publish",
          "messaging.message.body.size": how === "shared" ? 2 : 4,
          "messaging.message.id": event.id,
        });
        assert.equal(send.status.code, SpanStatusCode.UNSET);
      }
    } finally {
      await sub.close();
      unary.close();
    }
  });

  it("a refused publish leaves its send span with the error", T, async () => {
    const name = uniqueName();
    const err = await client.publish(`${name}.*`, "x").then(
      () => assert.fail("a wildcard channel is refused"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof EventBusError);
    const send = one(`send ${name}.*`);
    assert.equal(send.status.code, SpanStatusCode.ERROR);
    assert.ok(send.status.message?.includes(err.message), send.status.message);
    assert.equal(send.events.filter((e) => e.name === "exception").length, 1, "the exception is recorded");
  });

  it("the Worker runs each handler in a process span, a child of the send span", T, async () => {
    const name = uniqueName();
    const channel = `${name}.order`;
    await client.createConsumer(name, [channel]);
    const sub = client.subscribe(`${name}.next`);
    await sub.started();
    const [checkout, published] = await inSpan("checkout", () => client.publish(channel, "order 42"));
    let active: string | undefined;
    await work(client, name, async (_d, done) => {
      active = trace.getActiveSpan()?.spanContext().spanId;
      const charge = app.startSpan("charge");
      charge.end();
      await client.publish(`${name}.next`, "charged"); // continues the trace
      done();
      return new Ack();
    });
    await eventually(() => processes(channel).length === 1, "the process span");

    const send = one(`send ${channel}`);
    const [proc] = processes(channel);
    assert.equal(proc!.kind, SpanKind.CONSUMER);
    assert.equal(proc!.spanContext().traceId, checkout.spanContext().traceId, "the publisher's trace");
    assert.equal(proc!.parentSpanContext?.spanId, send.spanContext().spanId, "a child of the send span");
    assert.equal(proc!.parentSpanContext?.isRemote, true, "read from the event");
    assert.deepEqual(proc!.attributes, {
      "messaging.system": "eventbus",
      "messaging.destination.name": channel,
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.consumer.group.name": name,
      "messaging.message.id": published.eventId,
      "messaging.message.body.size": 8,
      "messaging.eventbus.attempt": 1,
      "messaging.eventbus.outcome": "ack",
    });
    assert.equal(proc!.status.code, SpanStatusCode.UNSET);
    assert.equal(active, proc!.spanContext().spanId, "active while the handler runs");
    assert.equal(one("charge").parentSpanContext?.spanId, proc!.spanContext().spanId, "the handler's spans nest under it");

    const next = one(`send ${name}.next`);
    assert.equal(next.parentSpanContext?.spanId, proc!.spanContext().spanId, "a publish from the handler continues the trace");
    const [followup] = await events(sub, 1);
    assert.equal(followup!.metadata.traceparent, traceparent(next));
    await sub.close();
  });

  it("a handler failing once: two process spans, both children of one send, and the broker's spans between", T, async () => {
    const name = uniqueName();
    const channel = `${name}.order`;
    await client.createConsumer(name, [channel], { backoff: { initialMs: 10, multiplier: 1, maxMs: 10 } });
    const [, published] = await inSpan("checkout", () => client.publish(channel, "42"));
    await work(client, name, (d, done) => {
      app.startSpan("charge").end();
      if (d.attempt === 1) throw new Error("bank down");
      done();
    });
    await eventually(() => processes(channel).length === 2, "both process spans");

    const send = one(`send ${channel}`);
    const traceId = send.spanContext().traceId;
    const sendId = send.spanContext().spanId;
    const [failed, succeeded] = processes(channel);
    for (const [i, p] of [failed!, succeeded!].entries()) {
      assert.equal(p.attributes["messaging.eventbus.attempt"], i + 1);
      assert.equal(p.attributes["messaging.message.id"], published.eventId);
      assert.equal(p.spanContext().traceId, traceId);
      assert.equal(p.parentSpanContext?.spanId, sendId, "the publisher's span is the parent of each attempt");
    }
    assert.equal(failed!.attributes["messaging.eventbus.outcome"], "retry");
    assert.equal(failed!.status.code, SpanStatusCode.ERROR);
    assert.equal(failed!.status.message, "Error: bank down");
    const [exception] = failed!.events.filter((e) => e.name === "exception");
    assert.equal(exception?.attributes?.["exception.message"], "bank down", "the error is recorded");
    assert.equal(succeeded!.attributes["messaging.eventbus.outcome"], "ack");
    assert.equal(succeeded!.status.code, SpanStatusCode.UNSET);
    const charges = named("charge").filter((c) => c.spanContext().traceId === traceId);
    assert.deepEqual(
      charges.map((c) => c.parentSpanContext?.spanId).sort(),
      [failed!, succeeded!].map((p) => p.spanContext().spanId).sort(),
      "each attempt's spans nest under its own process span",
    );

    // The broker's side of the same trace, as the OTLP receiver got it.
    await eventually(
      () => receiver.named(`deliver ${channel}`, traceId).length === 2 && receiver.named(`commit ${channel}`, traceId).length === 1,
      "the broker's spans",
    );
    const [publish] = receiver.named(`publish ${channel}`, traceId);
    assert.equal(publish?.parent_span_id, sendId, "the broker's publish is a child of send");
    assert.equal(publish?.service, "eventbusd");
    assert.equal(receiver.named(`commit ${channel}`, traceId)[0]?.parent_span_id, publish?.span_id);
    const delivers = receiver.named(`deliver ${channel}`, traceId);
    assert.deepEqual(delivers.map((d) => d.attributes["eventbus.attempt"]).sort(), ["1", "2"]);
    assert.ok(delivers.every((d) => d.parent_span_id === sendId));
  });

  it("retry and term outcomes are recorded as such", T, async () => {
    const name = uniqueName();
    const channel = `${name}.order`;
    await client.createConsumer(name, [channel], { backoff: { initialMs: 10, multiplier: 1, maxMs: 10 } });
    await client.publish(channel, "42");
    await work(client, name, (d, done) => {
      if (d.attempt === 1) return new Retry(10);
      done();
      return new Term("no such order");
    });
    await eventually(() => processes(channel).length === 2, "both process spans");
    const [retried, terminated] = processes(channel);
    assert.equal(retried!.attributes["messaging.eventbus.outcome"], "retry");
    assert.deepEqual(retried!.status, { code: SpanStatusCode.ERROR, message: "retry requested" });
    assert.equal(terminated!.attributes["messaging.eventbus.outcome"], "term");
    assert.deepEqual(terminated!.status, { code: SpanStatusCode.ERROR, message: "no such order" });
  });

  it("a handler still running at the shutdown timeout: its span ends with the worker's nack", T, async () => {
    const name = uniqueName();
    const channel = `${name}.order`;
    await client.createConsumer(name, [channel]);
    await client.publish(channel, "42");
    const started = deferred();
    const release = deferred();
    const worker = new Worker(
      client,
      name,
      async () => {
        started.resolve();
        await release.promise;
        return new Ack();
      },
      { shutdownTimeoutMs: 50 },
    );
    await worker.start();
    await within(started.promise, 20_000, "the handler");
    await worker.stop();
    const [proc] = processes(channel);
    assert.ok(proc, "ended at the shutdown timeout");
    assert.equal(proc.attributes["messaging.eventbus.outcome"], "retry");
    assert.deepEqual(proc.status, { code: SpanStatusCode.ERROR, message: "Error: worker shutdown" });
    release.resolve(); // the late result changes nothing
    await new Promise((r) => setImmediate(r));
    assert.equal(processes(channel).length, 1);
    assert.equal(processes(channel)[0]!.attributes["messaging.eventbus.outcome"], "retry");
  });

  it("a traceparent the caller set is kept, and the Worker continues it", T, async () => {
    const name = uniqueName();
    const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const state = "vendor=opaque";
    await client.createConsumer(name, [`${name}.one`]);
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    const metadata = { traceparent: own, tracestate: state, k: "v" };
    await inSpan("checkout", async () => {
      await client.publish(`${name}.one`, "1", { metadata });
      await client.publishBatch([{ channel: `${name}.batch`, payload: "2", metadata }]);
      for await (const _ of client.publishStream([{ channel: `${name}.stream`, payload: "3", metadata }])) {
        // one answer
      }
    });
    const received = await events(sub, 3);
    await sub.close();
    for (const e of received) assert.deepEqual(e.metadata, metadata, `${e.channel} keeps the caller's context`);
    for (const how of ["one", "batch", "stream"]) {
      assert.equal(one(`send ${name}.${how}`).kind, SpanKind.PRODUCER, "the send span is made all the same");
    }

    await work(client, name, (_d, done) => done());
    await eventually(() => processes(`${name}.one`).length === 1, "the process span");
    const [proc] = processes(`${name}.one`);
    assert.equal(proc!.spanContext().traceId, "0af7651916cd43dd8448eb211c80319c");
    assert.equal(proc!.parentSpanContext?.spanId, "b7ad6b7169203331");
    assert.equal(proc!.spanContext().traceState?.serialize(), state, "the trace state goes on");
  });

  it("publishBatch and publishStream give each event its own send span", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    const [batching, results] = await inSpan("batching", () =>
      client.publishBatch([0, 1, 2].map((i) => ({ channel: `${name}.batch`, payload: String(i) }))),
    );
    const [streaming, stream] = await inSpan("streaming", async () =>
      client.publishStream([0, 1].map((i) => ({ channel: `${name}.stream`, payload: String(i) }))),
    );
    for await (const _ of stream) {
      // read outside the span it was made in
    }
    const received = await events(sub, 5);
    await sub.close();

    for (const [how, parent, count] of [["batch", batching, 3], ["stream", streaming, 2]] as const) {
      const sends = named(`send ${name}.${how}`);
      assert.equal(sends.length, count, `${how}: one send span per event`);
      for (const send of sends) {
        assert.equal(send.parentSpanContext?.spanId, parent.spanContext().spanId, `${how}: a child of the caller's span`);
        const event = received.find((e) => e.id === send.attributes["messaging.message.id"]);
        assert.ok(event, `${how}: each send span names its event`);
        assert.equal(event.metadata.traceparent, traceparent(send), `${how}: each event carries its own send span`);
      }
    }
    assert.deepEqual(
      named(`send ${name}.batch`).map((s) => s.attributes["messaging.message.id"]).sort(),
      (results as PublishResponse[]).map((r) => r.eventId).sort(),
    );
  });

  it("a stream's send spans end with its totals and refusals, in each ack mode", T, async () => {
    for (const ack of ["cumulative", "none"] as const) {
      const name = uniqueName();
      const answers = [];
      for await (const answer of client.publishStream(
        [`${name}.a`, `${name}.*`, `${name}.b`].map((channel) => ({ channel, payload: "x" })),
        { ack },
      )) {
        answers.push(answer);
      }
      assert.equal(answers.filter((a) => a instanceof PublishRefused).length, 1, ack);
      const refused = one(`send ${name}.*`);
      assert.equal(refused.status.code, SpanStatusCode.ERROR, `${ack}: the refused event's span`);
      for (const channel of [`${name}.a`, `${name}.b`]) {
        assert.equal(one(`send ${channel}`).status.code, SpanStatusCode.UNSET, `${ack}: ended by the totals`);
      }
    }
  });

  it("a stream closed before an event's answer was read ends its span as cancelled", T, async () => {
    const name = uniqueName();
    const channel = `${name}.closed`;
    const sub = client.subscribe(channel);
    await sub.started();
    const more = deferred();
    async function* source(): AsyncGenerator<{ channel: string; payload: string }> {
      yield { channel, payload: "a" };
      await more.promise;
      yield { channel, payload: "b" };
    }
    let first: PublishResponse | undefined;
    for await (const answer of client.publishStream(source())) {
      first = answer;
      more.resolve();
      await take(sub, 2); // b is published, its answer not read
      break;
    }
    await sub.close();
    const sends = named(`send ${channel}`);
    assert.equal(sends.length, 2, "both spans ended");
    const answered = sends.find((s) => s.attributes["messaging.message.id"] === first?.eventId);
    assert.equal(answered?.status.code, SpanStatusCode.UNSET);
    const closed = sends.find((s) => s !== answered);
    assert.equal(closed?.status.code, SpanStatusCode.ERROR);
    assert.match(closed?.status.message ?? "", /closed before this event's answer was read/);
  });
});
