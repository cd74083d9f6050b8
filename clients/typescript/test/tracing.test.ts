// Tracing: the client's spans (kept in memory by the SDK this file registers, as an
// application registers its own) and eventbusd's spans (sent to the test OTLP receiver,
// `otlp-receiver`): one trace from the publisher's span to the worker's handler.
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";

import { SpanKind, context, trace } from "@opentelemetry/api";
import { InMemorySpanExporter, NodeTracerProvider, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-node";

import { Ack, Client, Retry, Worker, type Delivery, type Event } from "@socle/eventbus";

import { Daemon, REPO, deferred, eventually, take, uniqueName, within } from "./helpers.js";

const T = { timeout: 90_000 };
const RECEIVER = process.env.EVENTBUS_OTLP_RECEIVER ?? join(REPO, "target", "debug", "otlp-receiver");

const exporter = new InMemorySpanExporter();
new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }).register();
const app = trace.getTracer("app");

const named = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);

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

  it("one trace runs from the publisher through the broker to the worker", T, async () => {
    exporter.reset();
    const name = uniqueName();
    const channel = `${name}.order`;
    await client.createConsumer(name, [`${name}.>`], { backoff: { initialMs: 10, multiplier: 1, maxMs: 10 } });
    const checkout = app.startSpan("checkout");
    await context.with(trace.setSpan(context.active(), checkout), () => client.publish(channel, "42"));
    checkout.end();
    const done = deferred();
    const worker = new Worker(client, name, async (d: Delivery) => {
      app.startSpan("charge").end();
      if (d.attempt === 1) return new Retry(10);
      done.resolve();
      return new Ack();
    });
    await worker.start();
    await within(done.promise, 20_000, "the second attempt");
    await worker.stop();

    const [send] = named(`send ${channel}`);
    assert.ok(send, "the publish's span");
    const traceId = send.spanContext().traceId;
    const sendId = send.spanContext().spanId;
    assert.equal(send.parentSpanContext?.spanId, checkout.spanContext().spanId);
    assert.equal(send.kind, SpanKind.PRODUCER);
    assert.equal(send.attributes["messaging.destination.name"], channel);
    const processes = named(`process ${channel}`).sort(
      (a, b) => Number(a.attributes["messaging.eventbus.attempt"]) - Number(b.attributes["messaging.eventbus.attempt"]),
    );
    assert.deepEqual(processes.map((p) => p.attributes["messaging.eventbus.attempt"]), [1, 2]);
    assert.deepEqual(processes.map((p) => p.attributes["messaging.eventbus.outcome"]), ["retry", "ack"]);
    for (const p of processes) {
      assert.equal(p.spanContext().traceId, traceId);
      assert.equal(p.parentSpanContext?.spanId, sendId, "the publisher's span is the parent");
      assert.equal(p.kind, SpanKind.CONSUMER);
      assert.equal(p.attributes["messaging.consumer.group.name"], name);
    }
    const charges = named("charge").map((c) => c.parentSpanContext?.spanId).sort();
    assert.deepEqual(charges, processes.map((p) => p.spanContext().spanId).sort(), "the handler's spans nest under process");

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

  it("batches carry a context per event, streams the caller's, and an explicit one is kept", T, async () => {
    exporter.reset();
    const name = uniqueName();
    const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    await client.publish(`${name}.own`, "0", { metadata: { traceparent: own } });
    const batching = app.startSpan("batching");
    await context.with(trace.setSpan(context.active(), batching), async () => {
      await client.publishBatch([0, 1].map((i) => ({ channel: `${name}.batch`, payload: String(i) })));
      for await (const _ of client.publishStream([{ channel: `${name}.stream`, payload: "s" }])) {
        // one answer
      }
    });
    batching.end();
    const got = new Map<string, string[]>();
    for (const item of await take(sub, 4)) {
      const e = item as Event;
      got.set(e.channel, [...(got.get(e.channel) ?? []), e.metadata.traceparent!]);
    }
    await sub.close();
    assert.deepEqual(got.get(`${name}.own`), [own], "a caller's own context is kept");
    const sends = named(`send ${name}.batch`);
    assert.equal(sends.length, 2);
    const expected = sends.map((s) => `00-${s.spanContext().traceId}-${s.spanContext().spanId}-01`).sort();
    assert.deepEqual(got.get(`${name}.batch`)?.sort(), expected, "each event of a batch carries its own send span");
    assert.equal(got.get(`${name}.stream`)?.[0]?.split("-")[2], batching.spanContext().spanId, "a stream carries the caller's context");
  });
});
