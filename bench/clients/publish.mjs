#!/usr/bin/env node
// Everyday publishing from a Node service: CONCURRENCY async loops share one client, each
// awaiting its publish() of one durable event before the next.
//
//   node publish.mjs TARGET MODE COUNT CONCURRENCY PAYLOAD [--server-pid PID] [--warmup N]
//
// TARGET: the daemon's gRPC URL (http://127.0.0.1:PORT) for the eventbus modes, a NATS URL
// (nats://127.0.0.1:PORT) for jetstream. MODE: shared (@socle/eventbus's default: concurrent
// publish() calls share one PublishStream), unary (connect(url, { unaryPublish: true }): one
// Publish call each) or jetstream (nats.js, js.publish() on one connection). The events are
// durable: a durable consumer (eventbus) or a file-storage stream (JetStream) takes them,
// created before and deleted after the run. WARMUP events are published first, untimed.
//
// Prints one JSON line: lang, mode, count, published_per_s, p50_us, p99_us, and the CPU per
// event (µs, user + system) of this process (process.cpuUsage) and of the server process
// --server-pid (/proc/PID/stat), both over the timed events only.
//
// bench/clients.sh copies this file into a node project that has `nats` and
// `@socle/eventbus` installed, and runs it there (imports resolve from the file's folder).
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

const TICK = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());

function usage(message) {
  console.error(`${message}\nusage: node publish.mjs TARGET shared|unary|jetstream COUNT CONCURRENCY PAYLOAD [--server-pid PID] [--warmup N]`);
  process.exit(2);
}

/** The server process's user + system time, seconds (0 without a pid). */
function serverCpu(pid) {
  if (pid === undefined) return 0;
  // The command name may hold spaces: the fields after it start after ")".
  const text = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = text.slice(text.lastIndexOf(")") + 1).trim().split(/\s+/);
  return (Number(fields[11]) + Number(fields[12])) / TICK;
}

/** This process's user + system time, seconds. */
function ownCpu() {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

/**
 * Publishes `count` events from `concurrency` loops, each awaiting one publish before the
 * next; resolves to every publish's latency in nanoseconds.
 */
async function drive(publish, count, concurrency) {
  const latencies = [];
  let left = count;
  async function loop() {
    while (left > 0) {
      left -= 1;
      const start = process.hrtime.bigint();
      await publish();
      latencies.push(Number(process.hrtime.bigint() - start));
    }
  }
  await Promise.all(Array.from({ length: concurrency }, loop));
  return latencies;
}

function percentile(sortedNs, q) {
  return sortedNs[Math.min(sortedNs.length - 1, Math.floor(q * sortedNs.length))] / 1000;
}

const round = (x, digits) => Math.round(x * 10 ** digits) / 10 ** digits;

async function measure(publish, args) {
  await drive(publish, args.warmup, args.concurrency);
  const serverBefore = serverCpu(args.serverPid);
  const ownBefore = ownCpu();
  const start = performance.now();
  const latencies = await drive(publish, args.count, args.concurrency);
  const elapsed = (performance.now() - start) / 1000;
  const serverS = serverCpu(args.serverPid) - serverBefore;
  const ownS = ownCpu() - ownBefore;
  latencies.sort((a, b) => a - b);
  return {
    lang: "node",
    mode: args.mode,
    count: args.count,
    concurrency: args.concurrency,
    payload: args.payload,
    published_per_s: round(args.count / elapsed, 1),
    p50_us: round(percentile(latencies, 0.5), 1),
    p99_us: round(percentile(latencies, 0.99), 1),
    mean_us: round(latencies.reduce((a, b) => a + b, 0) / latencies.length / 1000, 1),
    server_cpu_us_per_event: round((serverS / args.count) * 1e6, 2),
    client_cpu_us_per_event: round((ownS / args.count) * 1e6, 2),
  };
}

async function runEventbus(args) {
  const { Client } = await import("@socle/eventbus");
  const name = `bench-${randomBytes(4).toString("hex")}`;
  const channel = `${name}.e`;
  const payload = Buffer.alloc(args.payload, "x");
  const client = await Client.connect(args.target, { unaryPublish: args.mode === "unary" });
  try {
    await client.createConsumer(name, [`${name}.>`]);
    try {
      return await measure(() => client.publish(channel, payload), args);
    } finally {
      await client.deleteConsumer(name);
    }
  } finally {
    client.close();
  }
}

async function runJetstream(args) {
  const { connect, StorageType } = await import("nats");
  const name = `bench-${randomBytes(4).toString("hex")}`;
  const subject = `${name}.e`;
  const payload = Buffer.alloc(args.payload, "x");
  const nc = await connect({ servers: args.target });
  try {
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({ name, subjects: [`${name}.>`], storage: StorageType.File });
    try {
      const js = nc.jetstream();
      return await measure(() => js.publish(subject, payload), args);
    } finally {
      await jsm.streams.delete(name);
    }
  } finally {
    await nc.close();
  }
}

function parse() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { "server-pid": { type: "string" }, warmup: { type: "string", default: "2000" } },
  });
  if (positionals.length !== 5) usage("expected 5 arguments");
  const [target, mode, count, concurrency, payload] = positionals;
  if (!["shared", "unary", "jetstream"].includes(mode)) usage(`unknown mode ${mode}`);
  const args = {
    target,
    mode,
    count: Number(count),
    concurrency: Number(concurrency),
    payload: Number(payload),
    warmup: Number(values.warmup),
    serverPid: values["server-pid"] === undefined ? undefined : Number(values["server-pid"]),
  };
  for (const key of ["count", "concurrency", "payload", "warmup"]) {
    if (!Number.isInteger(args[key]) || args[key] < 0) usage(`${key} must be a whole number`);
  }
  if (args.count < 1 || args.concurrency < 1) usage("count and concurrency must be positive");
  if (args.serverPid !== undefined && !Number.isInteger(args.serverPid)) usage("--server-pid must be a pid");
  return args;
}

const args = parse();
const result = await (args.mode === "jetstream" ? runJetstream(args) : runEventbus(args));
console.log(JSON.stringify(result));
