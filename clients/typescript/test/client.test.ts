// Client: publish, publishBatch, publishStream (ack modes), subscribe (gap after a
// restart), admin and consumer operations, push consumers, typed errors, the CJS build.
import assert from "node:assert/strict";
import { createServer, type IncomingHttpHeaders } from "node:http";
import { createHmac } from "node:crypto";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import { after, before, describe, it } from "node:test";

import {
  Ack,
  AlreadyExists,
  BackoffKind,
  Client,
  EventBusError,
  EventStatus,
  Gap,
  InvalidArgument,
  NotFound,
  PendingState,
  PublishRefused,
  Term,
  Unavailable,
  Worker,
  isGap,
  type Event,
  type PublishAck,
  type SubscriptionItem,
} from "@socle/eventbus";

import { Daemon, eventually, take, uniqueName, within } from "./helpers.js";

const T = { timeout: 60_000 };

function events(items: SubscriptionItem[]): Event[] {
  const gaps = items.filter(isGap);
  assert.deepEqual(gaps, [], "no gap expected");
  return items as Event[];
}

describe("client", () => {
  let daemon: Daemon;
  let client: Client;

  before(async () => {
    // The push test's endpoint listens on 127.0.0.1, which push.deny_networks refuses
    // by default: this daemon opts in, as local development does.
    daemon = await Daemon.start({ EVENTBUS__PUSH__ALLOW_NETWORKS: "127.0.0.0/8" });
    client = await Client.connect(daemon.url);
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
  });

  it("publishes to a live subscriber", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(`${name}.*`);
    await sub.started();
    const resp = await client.publish(`${name}.a`, "hello", { metadata: { k: "v" }, contentType: "text/plain" });
    assert.ok(resp.eventId);
    assert.equal(resp.deliveredCount, 1);
    const [ev] = events(await take(sub, 1));
    assert.equal(ev!.id, resp.eventId);
    assert.equal(ev!.channel, `${name}.a`);
    assert.equal(ev!.payload.toString(), "hello");
    assert.deepEqual(ev!.metadata, { k: "v" }, "no trace context added without an OpenTelemetry SDK");
    assert.equal(ev!.contentType, "text/plain");
    assert.ok(ev!.timestamp && ev!.timestamp.seconds > 0n);
    await sub.close();
    assert.deepEqual(await sub.next(), { done: true, value: undefined });
  });

  it("publishStream answers each event in order", T, async () => {
    const name = uniqueName();
    async function* requests() {
      for (let i = 0; i < 100; i++) yield { channel: `${name}.s`, payload: String(i) };
    }
    const answers = [];
    for await (const r of client.publishStream(requests(), { window: 8 })) answers.push(r);
    assert.equal(answers.length, 100);
    assert.equal(new Set(answers.map((a) => a.eventId)).size, 100);
  });

  it("publishStream in each mode ends with the refusal's error", T, async () => {
    const name = uniqueName();
    const got: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const r of client.publishStream([
          { channel: `${name}.ok`, payload: "1" },
          { channel: `${name}.*`, payload: "2" },
          { channel: `${name}.ok`, payload: "3" },
        ])) {
          got.push(r.eventId);
        }
      })(),
      (err: unknown) => err instanceof InvalidArgument && err.message.includes(`${name}.*`),
    );
    assert.equal(got.length, 1);
  });

  it("publishStream ack modes answer refusals in place", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(`${name}.*`);
    await sub.started();
    const bad = new Map([
      [3, `${name}.*`],
      [7, ""],
    ]);
    const requests = Array.from({ length: 20 }, (_, i) => ({ channel: bad.get(i) ?? `${name}.ok`, payload: String(i) }));
    let last: PublishAck | undefined;
    for (const ack of ["cumulative", "none"] as const) {
      const answers: Array<PublishAck | PublishRefused> = [];
      for await (const a of client.publishStream(requests, { ack, window: 4 })) answers.push(a);
      const refused = answers.filter((a): a is PublishRefused => a instanceof PublishRefused);
      assert.deepEqual(
        refused.map((r) => [r.position, r.error.constructor]),
        [
          [3, InvalidArgument],
          [7, InvalidArgument],
        ],
      );
      assert.ok(refused[0]!.error.message.includes(`${name}.*`));
      const totals = answers.filter((a): a is PublishAck => !(a instanceof PublishRefused));
      last = totals.at(-1)!;
      assert.equal(answers.at(-1), last);
      assert.equal(last.end, true);
      assert.deepEqual([last.count, last.refused, last.delivered], [18n, 2n, 18n]);
      if (ack === "none") assert.equal(answers.length, 3);
    }
    const got = events(await take(sub, 36));
    const expected = requests.filter((_, i) => !bad.has(i)).map((r) => r.payload);
    assert.deepEqual(
      got.map((e) => e.payload.toString()),
      [...expected, ...expected],
    );
    assert.equal(got.at(-1)!.id, last!.lastEventId);
    await sub.close();
    assert.throws(() => client.publishStream(requests, { ack: "sometimes" as "none" }), /ack must be one of/);
  });

  it("publishBatch answers each event in order, refusals typed in their slot", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(`${name}.*`);
    await sub.started();
    const results = await client.publishBatch([
      { channel: `${name}.a`, payload: "first" },
      { channel: `${name}.*`, payload: "wildcard" },
      { channel: `${name}.b`, payload: "last", metadata: { k: "v" } },
    ]);
    assert.equal(results.length, 3);
    const [first, refused, last] = results;
    assert.ok(!(first instanceof EventBusError) && first!.eventId && first!.deliveredCount === 1);
    assert.ok(refused instanceof InvalidArgument && refused.message.includes(`${name}.*`));
    assert.ok(!(last instanceof EventBusError) && last!.eventId);
    const received = events(await take(sub, 2));
    assert.deepEqual(
      received.map((e) => [e.id, e.payload.toString()]),
      [
        [(first as { eventId: string }).eventId, "first"],
        [(last as { eventId: string }).eventId, "last"],
      ],
    );
    assert.deepEqual(received.map((e) => e.metadata), [{}, { k: "v" }]);
    assert.deepEqual(await client.publishBatch([]), []);
    await sub.close();
  });

  it("errors are typed", T, async () => {
    const name = uniqueName();
    await assert.rejects(client.publish("bad..channel", "x"), InvalidArgument);
    await assert.rejects(client.getConsumer(name), (err: unknown) => err instanceof NotFound && err.code === 5);
    await client.createConsumer(name, [`${name}.>`]);
    await assert.rejects(client.createConsumer(name, [`${name}.other`]), AlreadyExists);
    await assert.rejects(Client.connect("http://127.0.0.1:1", { connectTimeoutMs: 300 }), Unavailable);
    // Without waiting for the connection, the call itself fails, typed.
    const nowhere = await Client.connect("127.0.0.1:1", { connectTimeoutMs: 0 });
    await assert.rejects(nowhere.stats(), Unavailable);
    await assert.rejects(
      (async () => {
        for await (const _ of nowhere.subscribe(name, { reconnect: false })) break;
      })(),
      Unavailable,
    );
    nowhere.close();
    // An aborted signal cancels the call with the signal's reason.
    const aborted = AbortSignal.abort(new Error("changed my mind"));
    await assert.rejects(client.publish(`${name}.x`, "x", { signal: aborted }), /changed my mind/);
  });

  it("admin calls", T, async () => {
    const name = uniqueName();
    const info = await client.createConsumer(name, [`${name}.>`], { ackDeadlineMs: 5000, maxAttempts: 3 });
    assert.equal(info.config?.name, name);
    assert.equal(info.config?.maxAttempts, 3);
    assert.equal(info.config?.ackDeadlineMs, 5000n);
    await client.publish(`${name}.x`, "1");
    assert.equal((await client.getConsumer(name)).pending, 1n);
    assert.ok((await client.listConsumers()).some((c) => c.config?.name === name));
    const stats = await client.stats();
    assert.ok(stats.totalPublished >= 1n);
    assert.equal(stats.mode, "in_memory");
    assert.ok((await client.channels()).some((c) => c.channel === `${name}.x`));
    assert.deepEqual((await client.eventLog(name)).entries, []);
    await client.deleteConsumer(name);
    await assert.rejects(client.getConsumer(name), NotFound);
  });

  it("consumer operations: pause, pending, resume, redrive", T, async () => {
    const name = uniqueName();
    const info = await client.createConsumer(name, [`${name}.>`], { exclusive: true, backoff: { kind: "linear" } });
    assert.equal(info.config?.exclusive, true);
    assert.equal(info.config?.backoff?.kind, BackoffKind.BACKOFF_KIND_LINEAR);
    assert.equal((await client.pause(name)).paused, true);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await client.publish(`${name}.job`, String(i))).eventId);
    const page = await client.listPending(name, { limit: 2 });
    assert.deepEqual(
      page.entries.map((e) => e.event?.id),
      ids.slice(0, 2),
    );
    assert.ok(page.nextPageToken);
    assert.ok(page.entries.every((e) => e.state === PendingState.PENDING_STATE_READY && e.attempt === 0));
    const all: string[] = [];
    for await (const e of client.listPendingAll(name)) all.push(e.event!.id);
    assert.deepEqual(all, ids);

    let fixed = false;
    const counts = async (redrivable: bigint, acked: bigint): Promise<boolean> => {
      const got = await client.getConsumer(name);
      return got.redrivable === redrivable && got.acked === acked;
    };
    const worker = new Worker(client, name, () => (fixed ? new Ack() : new Term("bug")));
    await worker.start();
    try {
      assert.equal((await client.resume(name)).paused, false);
      await eventually(() => counts(3n, 0n), "3 dead letters");
      fixed = true;
      const one = await client.redrive(name, { eventIds: [ids[0]!] });
      assert.deepEqual([one.redriven, one.remaining], [1n, 2n]);
      const again = await client.redrive(name, { eventIds: [ids[0]!] });
      assert.deepEqual([again.redriven, again.remaining], [0n, 2n]);
      const rest = await client.redrive(name);
      assert.deepEqual([rest.redriven, rest.remaining], [2n, 0n]);
      await eventually(() => counts(0n, 3n), "3 acked");
    } finally {
      await worker.stop();
    }
    const log = (await client.eventLog(name, { status: EventStatus.EVENT_STATUS_REDRIVEN })).entries;
    assert.deepEqual(log.map((e) => e.eventId).sort(), [...ids].sort());
    const everything = [];
    for await (const entry of client.eventLogAll(name)) everything.push(entry);
    assert.ok(everything.length >= 6);
    assert.equal((await client.getConsumer(name)).redriven, 3n);
    await assert.rejects(client.listPending(name, { pageToken: "bogus" }), InvalidArgument);
    for (const call of [
      (n: string) => client.listPending(n),
      (n: string) => client.redrive(n),
      (n: string) => client.pause(n),
      (n: string) => client.resume(n),
    ]) {
      await assert.rejects(call(`${name}-ghost`), NotFound);
    }
  });

  it("Admin.Unsubscribe ends the iterator", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(name, { name: "ts-test" });
    const rest = (async () => {
      const items = [];
      for await (const item of sub) items.push(item);
      return items;
    })();
    const id = await sub.started();
    const listed = (await client.subscriptions()).find((s) => s.id === id);
    assert.equal(listed?.name, "ts-test");
    await client.unsubscribe(id);
    assert.deepEqual(await within(rest, 10_000, "the iterator to end"), []);
  });

  it("an AbortSignal ends a subscription", T, async () => {
    const name = uniqueName();
    const controller = new AbortController();
    const sub = client.subscribe(name, { signal: controller.signal });
    await sub.started();
    const seen: SubscriptionItem[] = [];
    const loop = (async () => {
      for await (const item of sub) seen.push(item);
    })();
    await client.publish(name, "x");
    await eventually(() => seen.length === 1, "the event");
    controller.abort();
    await within(loop, 10_000, "the loop to end");
  });

  it("creates a push consumer: the broker POSTs signed events to an HTTP endpoint", T, async () => {
    const name = uniqueName();
    const received: Array<{ headers: IncomingHttpHeaders; body: Buffer }> = [];
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        received.push({ headers: req.headers, body: Buffer.concat(chunks) });
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
      const info = await client.createConsumer(name, `${name}.>`, { push: { url, secret: "k" } });
      assert.equal(info.config?.push?.url, url);
      assert.equal(info.config?.push?.secret, "(redacted)");
      const published = await client.publish(`${name}.created`, '{"n":1}', { contentType: "application/json" });
      await eventually(async () => (await client.getConsumer(name)).acked === 1n, "the push to be acked");
      const { headers, body } = received[0]!;
      assert.equal(headers["eventbus-id"], published.eventId);
      assert.equal(body.toString(), '{"n":1}');
      const [, t, sig] = /^t=([^,]+),v1=(.+)$/.exec(String(headers["eventbus-signature"]))!;
      assert.equal(sig, createHmac("sha256", "k").update(`${t}.`).update(body).digest("hex"));
    } finally {
      server.close();
    }
  });

  it("the CommonJS build works too", T, async () => {
    const require = createRequire(import.meta.url);
    const cjs = require("@socle/eventbus") as typeof import("@socle/eventbus");
    assert.notEqual(cjs.Client, Client, "a separate build");
    const other = await cjs.Client.connect(daemon.url);
    try {
      const name = uniqueName();
      assert.ok((await other.publish(name, "x")).eventId);
      await assert.rejects(other.getConsumer(name), cjs.NotFound);
    } finally {
      other.close();
    }
  });
});

describe("client against a daemon that restarts", () => {
  let daemon: Daemon;
  before(async () => {
    daemon = await Daemon.start();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("a subscriber reports a gap after a restart and carries on", T, async () => {
    const name = uniqueName();
    const client = await Client.connect(daemon.url);
    try {
      const sub = client.subscribe(name);
      await sub.started();
      await client.publish(name, "before");
      const [before] = events(await take(sub, 1));
      assert.equal(before!.payload.toString(), "before");

      await daemon.restart();
      const [gap] = await take(sub, 1, 30_000);
      assert.ok(gap instanceof Gap, `a gap, not ${JSON.stringify(gap)}`);
      assert.equal(gap.reconnects, 1);
      assert.ok(gap.resumedAt >= gap.lostAt);
      assert.equal(sub.recovered, false);
      // Re-subscribed: what is published now arrives.
      await sub.started();
      await client.publish(name, "after");
      const [after] = events(await take(sub, 1));
      assert.equal(after!.payload.toString(), "after");
      await sub.close();
    } finally {
      client.close();
    }
  });
});
