// Worker behaviour against a real daemon: concurrency and metrics, retry with the
// consumer's backoff, term and dead letters, Retry(afterMs), deadline extension of a long
// handler, graceful stop (drain), the stop timeout, and a broker restart.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { setTimeout as delay } from "node:timers/promises";

import { Registry } from "prom-client";

import {
  Ack,
  Client,
  DeadLetter,
  EventStatus,
  NotFound,
  Retry,
  Term,
  Worker,
  consumerConfig,
  type Delivery,
  type Event,
} from "@socle/eventbus";

import { Daemon, deferred, eventually, take, uniqueName, within } from "./helpers.js";

const T = { timeout: 90_000 };

async function publishN(client: Client, channel: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  const events = Array.from({ length: n }, (_, i) => ({ channel, payload: String(i) }));
  for await (const r of client.publishStream(events)) ids.push(r.eventId);
  return ids;
}

async function settled(client: Client, consumer: string): Promise<boolean> {
  const info = await client.getConsumer(consumer);
  return info.pending === 0n && info.inFlight === 0n;
}

async function sample(registry: Registry, metric: string, consumer: string, name = metric): Promise<number | undefined> {
  const values = (await registry.getSingleMetric(metric)!.get()).values as Array<{
    labels: Record<string, unknown>;
    value: number;
    metricName?: string;
  }>;
  return values.find((v) => v.labels.consumer === consumer && (v.metricName ?? metric) === name)?.value;
}

describe("worker", () => {
  let daemon: Daemon;
  let client: Client;

  before(async () => {
    daemon = await Daemon.start();
    client = await Client.connect(daemon.url);
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
  });

  it("handles every event once with concurrency 8, and counts it in the metrics", T, async () => {
    const name = uniqueName();
    const n = 400;
    const registry = new Registry();
    await client.createConsumer(name, [`${name}.>`]);
    const ids = await publishN(client, `${name}.e`, n);
    const seen = new Map<string, number>();
    let running = 0;
    let peak = 0;
    const worker = new Worker(
      client,
      name,
      async (d) => {
        running += 1;
        peak = Math.max(peak, running);
        await delay(1);
        seen.set(d.event.id, (seen.get(d.event.id) ?? 0) + 1);
        running -= 1;
        return new Ack();
      },
      { concurrency: 8, registry },
    );
    await worker.start();
    await eventually(() => settled(client, name), "all acked");
    await worker.stop();

    assert.deepEqual([...seen.keys()].sort(), [...ids].sort());
    assert.deepEqual(new Set(seen.values()), new Set([1]));
    assert.equal(peak, 8);
    const info = await client.getConsumer(name);
    assert.deepEqual([info.acked, info.redelivered, info.deadLettered], [BigInt(n), 0n, 0n]);
    assert.deepEqual(worker.stats(), { processed: n, failed: 0, retried: 0, terminated: 0, inFlight: 0 });
    assert.equal(await sample(registry, "socle_push_worker_processed_total", name), n);
    assert.equal(await sample(registry, "socle_push_worker_failed_total", name), 0);
    assert.equal(await sample(registry, "socle_push_worker_in_flight", name), 0);
    assert.equal(
      await sample(registry, "socle_push_worker_handle_seconds", name, "socle_push_worker_handle_seconds_count"),
      n,
    );
  });

  it("fails twice then succeeds: acked at attempt 3 after the consumer's backoff", T, async () => {
    const name = uniqueName();
    await client.createConsumer(name, [name], { backoff: { initialMs: 200, multiplier: 2, maxMs: 1000 } });
    const [eventId] = await publishN(client, name, 1);
    const attempts: Array<[number, number]> = [];
    const errors: Array<[string, string, number]> = [];
    const worker = new Worker(
      client,
      name,
      (d) => {
        attempts.push([d.attempt, performance.now()]);
        if (d.attempt < 3) throw new Error(`flaky ${d.attempt}`);
      },
      {
        concurrency: 8,
        onError: (event, err, attempt) => errors.push([event.id, (err as Error).message, attempt]),
      },
    );
    await worker.start();
    try {
      await eventually(() => settled(client, name), "acked");
    } finally {
      await worker.stop();
    }
    assert.deepEqual(
      attempts.map(([a]) => a),
      [1, 2, 3],
    );
    // Redelivered after the consumer's backoff: 200 ms, then 400 ms.
    assert.ok(attempts[1]![1] - attempts[0]![1] >= 180);
    assert.ok(attempts[2]![1] - attempts[1]![1] >= 380);
    assert.deepEqual(errors, [
      [eventId, "flaky 1", 1],
      [eventId, "flaky 2", 2],
    ]);
    const [entry] = (await client.eventLog(name)).entries;
    assert.equal(entry!.status, EventStatus.EVENT_STATUS_COMPLETED);
    assert.equal(entry!.attempts, 3);
    assert.deepEqual(
      entry!.failures.map((f) => f.reason),
      ["Error: flaky 1", "Error: flaky 2"],
    );
    const st = worker.stats();
    assert.deepEqual([st.processed, st.failed, st.retried], [1, 2, 2]);
  });

  it("always failing: dead-lettered on the dead-letter channel with every reason", T, async () => {
    const name = uniqueName();
    await client.createConsumer(name, [`${name}.>`], {
      maxAttempts: 3,
      backoff: { initialMs: 20, multiplier: 1, maxMs: 20 },
    });
    const dlq = client.subscribe(`dlq.${name}.>`);
    await dlq.started();
    const [failing] = await publishN(client, `${name}.pay`, 1);
    class Boom extends Error {
      override name = "Boom";
    }
    const worker = new Worker(client, name, (d) => {
      throw new Boom(`boom ${d.attempt}`);
    });
    await worker.start();
    let letter: Event | undefined;
    try {
      [letter] = (await take(dlq, 1)) as Event[];
    } finally {
      await worker.stop();
      await dlq.close();
    }
    assert.equal(letter!.channel, `dlq.${name}.pay`);
    assert.equal(letter!.contentType, "application/x-protobuf; type=eventbus.v1.DeadLetter");
    const dead = DeadLetter.decode(letter!.payload);
    assert.deepEqual([dead.event?.id, dead.consumer, dead.attempts], [failing, name, 3]);
    assert.deepEqual(
      dead.failures.map((f) => f.reason),
      ["Boom: boom 1", "Boom: boom 2", "Boom: boom 3"],
    );
    const [entry] = (await client.eventLog(name, { status: EventStatus.EVENT_STATUS_DEAD_LETTERED })).entries;
    assert.equal(entry!.eventId, failing);
  });

  it("Term dead-letters at once; Retry(afterMs) beats the backoff", T, async () => {
    const name = uniqueName();
    await client.createConsumer(name, [`${name}.>`]);
    const dlq = client.subscribe(`dlq.${name}.>`);
    await dlq.started();
    await client.publish(`${name}.term`, "");
    await client.publish(`${name}.retry`, "");
    const seen: Array<[string, number, number]> = [];
    const worker = new Worker(client, name, (d) => {
      seen.push([d.event.channel, d.attempt, performance.now()]);
      if (d.event.channel.endsWith("term")) return new Term("invalid order");
      return d.attempt === 1 ? new Retry(50) : new Ack();
    });
    await worker.start();
    let dead: DeadLetter;
    try {
      const [letter] = (await take(dlq, 1)) as Event[];
      dead = DeadLetter.decode(letter!.payload);
      await eventually(() => settled(client, name), "settled");
    } finally {
      await worker.stop();
      await dlq.close();
    }
    assert.equal(dead!.attempts, 1);
    assert.deepEqual(
      dead!.failures.map((f) => f.reason),
      ["invalid order"],
    );
    const retries = seen.filter(([c]) => c.endsWith("retry")).map(([, , t]) => t);
    assert.equal(retries.length, 2);
    assert.ok(retries[1]! - retries[0]! >= 40, "redelivered after the delay asked for");
    assert.ok(retries[1]! - retries[0]! < 900, "not after the 1 s backoff");
    const st = worker.stats();
    assert.deepEqual([st.processed, st.failed, st.retried, st.terminated], [1, 2, 1, 1]);
  });

  it("a long handler is not redelivered while it runs (its deadline is extended)", T, async () => {
    const name = uniqueName();
    await client.createConsumer(name, [name], { ackDeadlineMs: 600 });
    await publishN(client, name, 1);
    const attempts: number[] = [];
    const worker = new Worker(
      client,
      name,
      async (d) => {
        attempts.push(d.attempt);
        await delay(2000); // more than three ack deadlines
      },
      { concurrency: 2 },
    );
    await worker.start();
    try {
      await eventually(() => settled(client, name), "acked");
    } finally {
      await worker.stop();
    }
    assert.deepEqual(attempts, [1]);
    const info = await client.getConsumer(name);
    assert.deepEqual([info.acked, info.redelivered], [1n, 0n]);
  });

  it("stop() lets running handlers finish and hands back the rest, costing no attempt", T, async () => {
    const name = uniqueName();
    const n = 40;
    // One attempt allowed: handing back what no handler started must not count one (it
    // would be dead-lettered).
    await client.createConsumer(name, [`${name}.>`], { maxAttempts: 1 });
    const ids = await publishN(client, `${name}.e`, n);
    const started: string[] = [];
    const finished: string[] = [];
    const fourRunning = deferred();
    const release = deferred();
    const first = new Worker(
      client,
      name,
      async (d) => {
        started.push(d.event.id);
        if (started.length === 4) fourRunning.resolve();
        await release.promise;
        finished.push(d.event.id);
      },
      { concurrency: 4, shutdownTimeoutMs: 10_000 },
    );
    await first.start();
    await within(fourRunning.promise, 10_000, "four handlers running");
    assert.ok(first.backlog() > 0);
    const stopping = first.stop(); // from now on no handler starts
    release.resolve();
    await within(stopping, 10_000, "stop");
    assert.deepEqual([...finished].sort(), [...started].sort());
    assert.equal(started.length, 4);
    assert.equal(first.stats().processed, 4);

    const rest: string[] = [];
    const attempts = new Set<number>();
    const second = new Worker(
      client,
      name,
      (d) => {
        rest.push(d.event.id);
        attempts.add(d.attempt);
      },
      { concurrency: 8 },
    );
    await second.start();
    try {
      await eventually(() => settled(client, name), "the rest handled");
    } finally {
      await second.stop();
    }
    assert.deepEqual([...finished, ...rest].sort(), [...ids].sort()); // nothing lost, nothing twice
    assert.deepEqual(attempts, new Set([1]), "handed back unstarted: no attempt counted");
    const info = await client.getConsumer(name);
    assert.deepEqual([info.acked, info.deadLettered, info.redelivered], [BigInt(n), 0n, 0n]);
  });

  it("the stop timeout aborts stuck handlers and nacks them", T, async () => {
    const name = uniqueName();
    await client.createConsumer(name, [name]);
    const [eventId] = await publishN(client, name, 1);
    const stuck = deferred();
    let abortedWith: unknown;
    const worker = new Worker(
      client,
      name,
      (_d, { signal }) => {
        stuck.resolve();
        return new Promise<void>((resolve) =>
          signal.addEventListener("abort", () => {
            abortedWith = signal.reason;
            setTimeout(resolve, 50); // its result comes too late to count
          }),
        );
      },
      { shutdownTimeoutMs: 200, logger: {} },
    );
    await worker.start();
    await within(stuck.promise, 10_000, "the handler to start");
    await within(worker.stop(), 10_000, "stop");
    assert.match(String(abortedWith), /worker shutdown/);
    assert.equal(worker.stats().inFlight, 0);

    const got: Array<[string, number]> = [];
    const next = new Worker(client, name, (d: Delivery) => {
      got.push([d.event.id, d.attempt]);
    });
    await next.start();
    try {
      await eventually(() => settled(client, name), "redelivered and acked");
    } finally {
      await next.stop();
    }
    assert.deepEqual(got, [[eventId, 2]]);
    const [entry] = (await client.eventLog(name)).entries;
    assert.deepEqual(
      entry!.failures.map((f) => f.reason),
      ["worker shutdown"],
    );
  });

  it("attaching to an unknown consumer fails start(); createIfMissing creates it", T, async () => {
    const name = uniqueName();
    await assert.rejects(new Worker(client, name, () => {}).start(), NotFound);
    const got: string[] = [];
    const worker = new Worker(client, name, (d) => void got.push(d.event.payload.toString()), {
      createIfMissing: consumerConfig(name, `${name}.>`, { maxAttempts: 2 }),
    });
    await worker.start();
    try {
      assert.equal(worker.info?.config?.maxAttempts, 2);
      await client.publish(`${name}.x`, "made");
      await eventually(() => got.length === 1, "the event");
    } finally {
      await worker.stop();
    }
    assert.deepEqual(got, ["made"]);
  });
});

describe("worker and a broker restart", () => {
  let daemon: Daemon;
  before(async () => {
    daemon = await Daemon.start();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("reconnects after the daemon is killed and restarted, and finishes", T, async () => {
    const name = uniqueName();
    const n = 300;
    const client = await Client.connect(daemon.url);
    try {
      await client.createConsumer(name, [`${name}.>`]);
      const ids = await publishN(client, `${name}.e`, n);
      const seen = new Map<string, number>();
      const hooks: string[] = [];
      const warnings: string[] = [];
      const worker = new Worker(
        client,
        name,
        async (d) => {
          await delay(2);
          seen.set(d.event.id, (seen.get(d.event.id) ?? 0) + 1);
        },
        {
          concurrency: 8,
          onStart: () => hooks.push("start"),
          onStop: () => hooks.push("stop"),
          logger: { warn: (m) => warnings.push(m) },
        },
      );
      await worker.start();
      await eventually(() => seen.size >= n / 3, "a third handled");
      await daemon.restart(); // kill -9, then the same port and data directory
      await eventually(() => ids.every((id) => seen.has(id)), "every event handled", 30_000);
      await eventually(() => settled(client, name), "all acked", 30_000);
      await worker.stop();
      assert.ok(worker.connects >= 2, `connects ${worker.connects}`);
      assert.ok(warnings.some((w) => w.includes("reconnecting")));
      assert.deepEqual(hooks, ["start", "stop"]);
      assert.equal((await client.getConsumer(name)).deadLettered, 0n);
    } finally {
      client.close();
    }
  });
});
