// `Worker`: the push worker for a durable consumer, so nobody hand-writes the Consume loop.
//
// Layout of a running worker (all on the event loop, no locks):
// - one Consume stream at a time (a session): attach, then every delivery goes to a local
//   queue; at most `concurrency + queueCapacity` are ever held, the `max_in_flight` asked
//   for at attach, so the broker never sends more;
// - up to `concurrency` handlers run at once, started from the queue as others finish;
// - acks are batched (sent when `ackBatch` ids wait, or `ackIntervalMs` after the first);
//   nacks, terms and extends go at once;
// - a timer sends `Extend` for every held event (queued or running) older than half the
//   consumer's ack deadline, so a long handler is not redelivered while it runs.
// On a broken stream it reconnects with capped exponential backoff; deliveries queued but
// not started are dropped (the broker released them), acks of handlers still running are
// sent late on the next stream (a late ack still completes the event).
import type { ClientDuplexStream, StatusObject } from "@grpc/grpc-js";
import type { Span } from "@opentelemetry/api";
import type { Counter, Gauge, Histogram, Registry } from "prom-client";

import type { Client } from "./client.js";
import { EventBusError, Unavailable, fromServiceError, fromStatus, isTransient } from "./errors.js";
import {
  type ConsumeRequest,
  type ConsumeResponse,
  type ConsumerConfig,
  type ConsumerInfo,
  type Delivery as DeliveryMessage,
  type Event,
} from "./gen/eventbus/v1/eventbus.js";
import { asError, processed, processing } from "./tracing.js";
import { Backoff, type Logger, Signal, sleep } from "./util.js";

/** Nack reason of handlers still running when the shutdown timeout expires. */
export const SHUTDOWN_REASON = "worker shutdown";
// Handlers still running at the shutdown timeout are nacked for redelivery after this
// delay rather than the backoff, long enough that the broker has seen this stream close
// first, so they go to another client rather than back to us.
const SHUTDOWN_NACK_DELAY_MS = 100n;
// How long a stopping worker waits for the broker's `drained`, then for the stream's end.
const CLOSE_TIMEOUT_MS = 5000;
// Bound on the broker's `attached` answer.
const ATTACH_TIMEOUT_MS = 10_000;
const IDS_PER_MESSAGE = 1024;

/** A delivery as a handler sees it: the event, its attempt (1-based) and ack deadline. */
export type Delivery = Omit<DeliveryMessage, "event"> & { event: Event };

/** Handler outcome: done, acknowledge (returning nothing means the same). */
export class Ack {}

/** Handler outcome: failed, redeliver after `afterMs` milliseconds (undefined: the consumer's backoff). */
export class Retry {
  constructor(readonly afterMs?: number) {}
}

/** Handler outcome: give up now, dead-letter the event with this reason. */
export class Term {
  constructor(readonly reason: string = "") {}
}

export type Outcome = Ack | Retry | Term | undefined | void;

/** What a handler gets besides the delivery. */
export interface HandlerContext {
  /** Aborted when the worker gives up on the handler (still running at the shutdown timeout). */
  signal: AbortSignal;
}

/** Runs once per delivery; a thrown error (or rejected promise) means retry with its message as the reason. */
export type Handler = (delivery: Delivery, context: HandlerContext) => Outcome | Promise<Outcome>;

export interface WorkerOptions {
  /** Handlers running at once (default 16). */
  concurrency?: number;
  /** Deliveries held locally beyond those running (default max(256, 4 × concurrency)). */
  queueCapacity?: number;
  /** How long `stop()` waits for running handlers before nacking them (default 30,000 ms). */
  shutdownTimeoutMs?: number;
  /** Create the consumer on attach when it does not exist: a `ConsumerConfig` (see `consumerConfig`). */
  createIfMissing?: ConsumerConfig;
  /** prom-client registry of the host: the `socle_push_worker_*` metrics (label `consumer`) go there. */
  registry?: Registry;
  /** Delays between reconnections (default 100 ms doubling to 5 s, ±20%). */
  backoff?: Backoff | { initialMs?: number; maxMs?: number; multiplier?: number };
  /** Most deliveries per message from the broker (default 256). */
  maxBatch?: number;
  /** Acks are sent when this many wait (default 512)... */
  ackBatch?: number;
  /** ... or this long after the first (default 5 ms). */
  ackIntervalMs?: number;
  /** Aborting stops the worker, like `stop()`. */
  signal?: AbortSignal;
  /** Where reconnections and failing hooks are reported (default `console`). */
  logger?: Logger;
  onStart?: () => unknown;
  onSuccess?: (delivery: Delivery) => unknown;
  /** `error`: what the handler threw, or the `Retry`/`Term` it returned. */
  onError?: (event: Event, error: unknown, attempt: number) => unknown;
  onStop?: () => unknown;
}

/** Counters since the worker was created. */
export interface WorkerStats {
  /** Handler runs that ended in Ack. */
  processed: number;
  /** Handler runs that threw or returned Retry/Term. */
  failed: number;
  /** Failed runs nacked for redelivery (threw or Retry). */
  retried: number;
  /** Failed runs dead-lettered at once (Term). */
  terminated: number;
  /** Handlers running now. */
  inFlight: number;
}

interface Metrics {
  processed: Counter<"consumer">;
  failed: Counter<"consumer">;
  inFlight: Gauge<"consumer">;
  handleSeconds: Histogram<"consumer">;
}

const METRICS = new WeakMap<Registry, Metrics>();

async function metricsFor(registry: Registry): Promise<Metrics> {
  const known = METRICS.get(registry);
  if (known) return known;
  const prom = await import("prom-client");
  const again = METRICS.get(registry);
  if (again) return again;
  const existing = <T>(name: string): T | undefined => registry.getSingleMetric(name) as T | undefined;
  const labelNames = ["consumer"] as const;
  const metrics: Metrics = {
    processed:
      existing("socle_push_worker_processed_total") ??
      new prom.Counter({
        name: "socle_push_worker_processed_total",
        help: "Handler runs that ended in Ack.",
        labelNames,
        registers: [registry],
      }),
    failed:
      existing("socle_push_worker_failed_total") ??
      new prom.Counter({
        name: "socle_push_worker_failed_total",
        help: "Handler runs that threw or returned Retry/Term.",
        labelNames,
        registers: [registry],
      }),
    inFlight:
      existing("socle_push_worker_in_flight") ??
      new prom.Gauge({
        name: "socle_push_worker_in_flight",
        help: "Handlers running now.",
        labelNames,
        registers: [registry],
      }),
    handleSeconds:
      existing("socle_push_worker_handle_seconds") ??
      new prom.Histogram({
        name: "socle_push_worker_handle_seconds",
        help: "Time spent in the handler, per run.",
        labelNames,
        registers: [registry],
      }),
  };
  METRICS.set(registry, metrics);
  return metrics;
}

/** One consumer's series, resolved once. */
interface ConsumerMetrics {
  processed: { inc(): void };
  failed: { inc(): void };
  inFlight: { inc(): void; dec(): void };
  handleSeconds: { observe(value: number): void };
}

/** One Consume stream. */
interface Session {
  readonly id: number;
  readonly call: ClientDuplexStream<ConsumeRequest, ConsumeResponse>;
  attached: boolean;
  drained: Signal;
  /** Resolves when the stream ends: with the error, or undefined when it ended with OK. */
  ended: Signal<EventBusError | undefined>;
  extendTimer?: NodeJS.Timeout;
}

/** A delivery held: received and not yet answered (queued or running). */
interface Held {
  /** Session it came on: a nack, term or extend only makes sense on that one. */
  session: number;
  /** Reception or last extension (performance.now()), for deadline extension. */
  at: number;
}

interface Running {
  readonly session: number;
  /** Given up on at the shutdown timeout: its result is ignored (it was nacked). */
  abandoned: boolean;
  /** Its `process` span (ended with the outcome). */
  span?: Span;
}

/**
 * Runs `handler` for each event of the durable consumer `consumer`.
 *
 * ```ts
 * const worker = new Worker(client, "billing", handle, { concurrency: 16 });
 * await worker.start(); // resolves once attached
 * // ...
 * await worker.stop();  // graceful: running handlers finish (up to shutdownTimeoutMs)
 * ```
 *
 * The handler gets a `Delivery` (`event`, `attempt` 1-based, `deadline`) and returns
 * `new Ack()` / nothing, `new Retry(afterMs?)` or `new Term(reason)`; a thrown error means
 * retry (nack with the error as the reason; the consumer's backoff applies).
 */
export class Worker {
  readonly client: Client;
  readonly consumer: string;
  readonly handler: Handler;
  readonly concurrency: number;
  readonly queueCapacity: number;
  readonly shutdownTimeoutMs: number;
  /** The consumer as the broker described it on the last attach. */
  info: ConsumerInfo | undefined;
  /** Successful attaches so far (1 + reconnects). */
  connects = 0;

  private readonly options: WorkerOptions;
  private readonly backoff: Backoff;
  private readonly ackBatch: number;
  private readonly ackIntervalMs: number;
  private readonly logger: Logger;
  private metrics: ConsumerMetrics | undefined;

  private processed = 0;
  private failed = 0;
  private retried = 0;
  private terminated = 0;
  private inFlight = 0;

  private readonly queue: Delivery[] = [];
  private readonly held = new Map<string, Held>();
  private readonly running = new Map<string, Running>();
  private acks: string[] = [];
  private controls: ConsumeRequest[] = [];
  private flushTimer: NodeJS.Timeout | undefined;
  private flushSoon = false;
  private ackDeadlineMs = 30_000;

  private session: Session | undefined;
  private sessions = 0;
  private stopping = false;
  private readonly stopper = new AbortController();
  // Aborted at the shutdown timeout: the signal of every handler still running then.
  private readonly giveUp = new AbortController();
  private readonly stopped = new Promise<"stop">((resolve) =>
    this.stopper.signal.addEventListener("abort", () => resolve("stop"), { once: true }),
  );
  private readonly attachedOnce = new Signal();
  private idle: Signal | undefined;
  private loop: Promise<void> | undefined;

  constructor(client: Client, consumer: string, handler: Handler, options: WorkerOptions = {}) {
    const concurrency = options.concurrency ?? 16;
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new RangeError("concurrency must be an integer of at least 1");
    this.client = client;
    this.consumer = consumer;
    this.handler = handler;
    this.concurrency = concurrency;
    this.queueCapacity = options.queueCapacity ?? Math.max(256, 4 * concurrency);
    this.shutdownTimeoutMs = options.shutdownTimeoutMs ?? 30_000;
    this.options = options;
    this.backoff = options.backoff instanceof Backoff ? options.backoff : new Backoff(options.backoff);
    this.ackBatch = options.ackBatch ?? 512;
    this.ackIntervalMs = options.ackIntervalMs ?? 5;
    this.logger = options.logger ?? console;
    if (options.signal?.aborted) this.stopping = true;
    else options.signal?.addEventListener("abort", () => void this.stop(), { once: true });
  }

  // --- public API ---

  stats(): WorkerStats {
    return {
      processed: this.processed,
      failed: this.failed,
      retried: this.retried,
      terminated: this.terminated,
      inFlight: this.inFlight,
    };
  }

  /** Deliveries received and waiting locally for a free handler. */
  backlog(): number {
    return this.stopping ? 0 : this.queue.length;
  }

  /**
   * Starts the worker and resolves once it is attached; rejects when attaching fails with
   * an error that retrying cannot fix (`NotFound`, `Unauthenticated`, `PermissionDenied`...).
   * Transient failures (broker down) are retried meanwhile.
   */
  async start(): Promise<void> {
    if (this.loop !== undefined) throw new Error("worker already started");
    if (this.stopping) throw new Error("worker stopped");
    if (this.options.registry) {
      const m = await metricsFor(this.options.registry);
      this.metrics = {
        processed: m.processed.labels(this.consumer),
        failed: m.failed.labels(this.consumer),
        inFlight: m.inFlight.labels(this.consumer),
        handleSeconds: m.handleSeconds.labels(this.consumer),
      };
      // Series exist from the start, at 0.
      m.processed.inc({ consumer: this.consumer }, 0);
      m.failed.inc({ consumer: this.consumer }, 0);
      m.inFlight.inc({ consumer: this.consumer }, 0);
    }
    this.loop = this.runLoop();
    this.loop.catch(() => {}); // surfaced by start(), wait() and stop()
    await Promise.race([this.attachedOnce.promise, this.loop]);
  }

  /** Resolves when the worker has stopped; rejects with the error that ended it, if any. */
  wait(): Promise<void> {
    return this.loop ?? Promise.resolve();
  }

  /** `start()`, then `wait()`: runs until stopped (`stop()` or the `signal` option). */
  async run(): Promise<void> {
    await this.start();
    await this.wait();
  }

  /**
   * Graceful stop: takes no more events, hands back those no handler started (no attempt
   * counted: another worker gets them at once), waits up to `shutdownTimeoutMs` for running
   * handlers (their acks are sent), nacks those still running (and aborts their signal),
   * closes the stream, runs `onStop`. Resolves even if the worker had failed.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    this.stopper.abort();
    if (this.loop !== undefined) {
      try {
        await this.loop;
      } catch {
        // the failure is wait()'s to report
      }
    }
  }

  // --- the loop ---

  private async runLoop(): Promise<void> {
    await this.hook("onStart", () => this.options.onStart?.());
    let failures = 0;
    try {
      while (!this.stopping) {
        let error: EventBusError;
        let attached = false;
        try {
          const session = await this.attach();
          attached = true;
          const outcome = await Promise.race([session.ended.promise, this.stopped]);
          if (outcome === "stop") break; // drained below while the stream is still open
          error = outcome ?? new Unavailable("UNAVAILABLE: the broker ended the consume stream", 14);
        } catch (e) {
          error = fromServiceError(e);
        }
        if (this.stopping) break;
        if (!isTransient(error)) throw error;
        this.logger.warn?.(`eventbus worker ${this.consumer}: stream broken (${error.message}), reconnecting`);
        failures = attached ? 1 : failures + 1;
        await sleep(this.backoff.delay(failures), this.stopper.signal);
      }
    } finally {
      this.stopping = true;
      await this.drain();
      await this.hook("onStop", () => this.options.onStop?.());
    }
  }

  /** Opens a Consume stream and waits for `attached`. */
  private attach(): Promise<Session> {
    const call = this.client.bus.consume(this.client.metadata());
    const session: Session = {
      id: ++this.sessions,
      call,
      attached: false,
      drained: new Signal(),
      ended: new Signal<EventBusError | undefined>(),
    };
    return new Promise<Session>((resolve, reject) => {
      const timer = setTimeout(() => {
        fail(new Unavailable(`UNAVAILABLE: no attached answer within ${ATTACH_TIMEOUT_MS} ms`, 14));
        call.cancel();
      }, ATTACH_TIMEOUT_MS);
      const fail = (err: EventBusError | undefined): void => {
        clearTimeout(timer);
        this.endSession(session, err);
        if (!session.attached) reject(err ?? new Unavailable("UNAVAILABLE: consume stream ended before attached", 14));
      };
      call.on("data", (response: ConsumeResponse) => {
        if (response.attached && !session.attached) {
          clearTimeout(timer);
          this.onAttached(session, response.attached.consumer);
          resolve(session);
        } else {
          this.onMessage(session, response);
        }
      });
      // The first of the two wins: the error, or the stream's OK end.
      call.on("error", (err: unknown) => fail(fromServiceError(err)));
      call.on("status", (st: StatusObject) => fail(st.code === 0 ? undefined : fromStatus(st.code, st.details)));
      // Stopping before the broker answered: give up on this stream.
      const onStop = (): void => {
        if (!session.attached) call.cancel();
      };
      if (this.stopper.signal.aborted) onStop();
      else this.stopper.signal.addEventListener("abort", onStop, { once: true });
      session.ended.promise.then(() => this.stopper.signal.removeEventListener("abort", onStop));
      call.write({
        attach: {
          consumer: this.consumer,
          maxInFlight: this.concurrency + this.queueCapacity,
          maxBatch: this.options.maxBatch ?? 256,
          createIfMissing: this.options.createIfMissing,
        },
      });
    });
  }

  private onAttached(session: Session, info: ConsumerInfo | undefined): void {
    session.attached = true;
    this.info = info;
    const ms = Number(info?.config?.ackDeadlineMs ?? 0n);
    this.ackDeadlineMs = ms > 0 ? ms : 30_000;
    this.session = session;
    this.connects += 1;
    session.extendTimer = setInterval(() => this.extend(session), Math.max(50, this.ackDeadlineMs / 4));
    session.extendTimer.unref?.();
    this.attachedOnce.resolve();
    // Late acks from a previous stream.
    if (this.acks.length > 0 || this.controls.length > 0) this.scheduleFlush(true);
  }

  private onMessage(session: Session, response: ConsumeResponse): void {
    if (response.drained) {
      session.drained.resolve();
      return;
    }
    const deliveries = response.deliveries?.deliveries;
    if (!deliveries || deliveries.length === 0) return;
    if (this.stopping) {
      // Sent before the broker read our drain: back unstarted.
      const ids = deliveries.map((d) => d.event?.id ?? "");
      this.sendControl(session, { release: { eventIds: ids, drain: false } });
      return;
    }
    const now = performance.now();
    for (const d of deliveries) {
      const event = d.event;
      if (!event) continue;
      this.held.set(event.id, { session: session.id, at: now });
      this.queue.push(d as Delivery);
    }
    this.dispatch();
  }

  private endSession(session: Session, error: EventBusError | undefined): void {
    if (session.ended.settled) return;
    if (session.extendTimer) clearInterval(session.extendTimer);
    session.ended.resolve(error);
    session.drained.resolve(); // nothing follows on it either way
    if (this.session !== session) return;
    this.session = undefined;
    if (!this.stopping) {
      // Queued, not started: the broker released them when the stream broke.
      for (const d of this.queue.splice(0)) this.held.delete(d.event.id);
    }
  }

  // --- handlers ---

  private dispatch(): void {
    while (!this.stopping && this.running.size < this.concurrency && this.queue.length > 0) {
      this.startHandler(this.queue.shift()!);
    }
  }

  private startHandler(delivery: Delivery): void {
    const id = delivery.event.id;
    const entry: Running = {
      session: this.held.get(id)?.session ?? 0,
      abandoned: false,
    };
    this.running.set(id, entry);
    this.inFlight += 1;
    this.metrics?.inFlight.inc();
    const t0 = performance.now();
    const { span, result } = processing(this.consumer, delivery, (): Promise<Outcome> => {
      try {
        return Promise.resolve(this.handler(delivery, { signal: this.giveUp.signal }));
      } catch (err) {
        return Promise.reject(err);
      }
    });
    entry.span = span;
    result.then(
      (outcome) => this.finished(delivery, entry, t0, outcome, undefined),
      (err: unknown) => this.finished(delivery, entry, t0, undefined, err ?? new Error("handler failed")),
    );
  }

  private finished(delivery: Delivery, entry: Running, t0: number, outcome: Outcome, err: unknown): void {
    if (entry.abandoned) return; // nacked at the shutdown timeout
    const id = delivery.event.id;
    this.running.delete(id);
    this.held.delete(id);
    this.inFlight -= 1;
    if (this.metrics) {
      this.metrics.inFlight.dec();
      this.metrics.handleSeconds.observe((performance.now() - t0) / 1000);
    }
    if (err === undefined && (outcome === undefined || outcome instanceof Ack)) {
      if (entry.span) processed(entry.span, "ack");
      this.processed += 1;
      this.metrics?.processed.inc();
      this.acks.push(id);
      this.scheduleFlush(this.acks.length >= this.ackBatch);
      if (this.options.onSuccess) void this.hook("onSuccess", () => this.options.onSuccess?.(delivery));
    } else {
      this.failed += 1;
      this.metrics?.failed.inc();
      let reported: unknown = err ?? outcome;
      if (err !== undefined || outcome instanceof Retry) {
        this.retried += 1;
        let reason: string;
        let delayMs = 0n;
        if (err !== undefined) {
          reason = err instanceof Error ? `${err.name}: ${err.message}` : `Error: ${String(err)}`;
          if (entry.span) processed(entry.span, "retry", asError(err));
        } else {
          reason = "retry requested";
          const after = (outcome as Retry).afterMs;
          if (after !== undefined) delayMs = BigInt(Math.max(1, Math.round(after)));
          if (entry.span) processed(entry.span, "retry", reason);
        }
        this.controlFor(entry.session, { nack: { eventId: id, reason, delayMs } });
      } else if (outcome instanceof Term) {
        this.terminated += 1;
        const reason = outcome.reason || "terminated";
        if (entry.span) processed(entry.span, "term", reason);
        this.controlFor(entry.session, { term: { eventId: id, reason } });
      } else {
        this.retried += 1;
        const wrong = new TypeError(`handler returned ${String(outcome)}, expected Ack, Retry, Term or nothing`);
        reported = wrong;
        if (entry.span) processed(entry.span, "retry", wrong);
        this.controlFor(entry.session, { nack: { eventId: id, reason: String(reported), delayMs: 0n } });
      }
      if (this.options.onError) {
        void this.hook("onError", () => this.options.onError?.(delivery.event, reported, delivery.attempt));
      }
    }
    this.dispatch();
    if (this.running.size === 0) this.idle?.resolve();
  }

  private async hook(name: string, fn: () => unknown): Promise<void> {
    try {
      await fn();
    } catch (err) {
      // A hook must never break the worker.
      this.logger.warn?.(`eventbus worker ${this.consumer}: hook ${name} failed: ${String(err)}`);
    }
  }

  // --- sending ---

  /** A nack or term for an event of session `sessionId`: dropped when that stream is gone
   * (losing it already counted the attempt as failed, and the event was released). */
  private controlFor(sessionId: number, request: ConsumeRequest): void {
    const session = this.session;
    if (session === undefined || session.id !== sessionId) return;
    this.controls.push(request);
    this.scheduleFlush(true);
  }

  private sendControl(session: Session, request: ConsumeRequest): void {
    if (this.session !== session) return;
    this.controls.push(request);
    this.scheduleFlush(true);
  }

  private scheduleFlush(now: boolean): void {
    if (now) {
      if (this.flushSoon) return;
      this.flushSoon = true;
      setImmediate(() => {
        this.flushSoon = false;
        this.flush();
      });
    } else if (this.flushTimer === undefined) {
      this.flushTimer = setTimeout(() => {
        this.flushTimer = undefined;
        this.flush();
      }, this.ackIntervalMs);
    }
  }

  /** Writes every waiting control message and ack; kept for the next stream when none is attached. */
  private flush(): void {
    const session = this.session;
    if (session === undefined || session.ended.settled || session.call.writableEnded) return;
    if (this.flushTimer !== undefined) {
      clearTimeout(this.flushTimer);
      this.flushTimer = undefined;
    }
    const call = session.call;
    for (const request of this.controls.splice(0)) call.write(request);
    const acks = this.acks.splice(0);
    for (let i = 0; i < acks.length; i += IDS_PER_MESSAGE) {
      call.write({ ack: { eventIds: acks.slice(i, i + IDS_PER_MESSAGE) } });
    }
  }

  private extend(session: Session): void {
    if (this.session !== session) return;
    const now = performance.now();
    const half = this.ackDeadlineMs / 2;
    const due: string[] = [];
    for (const [id, h] of this.held) {
      if (h.session === session.id && now - h.at >= half) {
        h.at = now;
        due.push(id);
      }
    }
    for (let i = 0; i < due.length; i += IDS_PER_MESSAGE) {
      this.controls.push({ extend: { eventIds: due.slice(i, i + IDS_PER_MESSAGE), byMs: 0n } });
    }
    if (due.length > 0) this.scheduleFlush(true);
  }

  // --- shutdown ---

  /**
   * What no handler started is handed back (no attempt counted), the handlers finish
   * (bounded), those still running are nacked, the stream closed once the broker has read
   * everything.
   */
  private async drain(): Promise<void> {
    const session = this.session;
    const unstarted = this.queue.splice(0).map((d) => d.event.id);
    for (const id of unstarted) this.held.delete(id);
    if (session !== undefined) {
      this.controls.push({ release: { eventIds: unstarted, drain: true } });
      this.flush();
    }
    if (this.running.size > 0) {
      this.idle = new Signal();
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<"timeout">((resolve) => {
        timer = setTimeout(() => resolve("timeout"), this.shutdownTimeoutMs);
      });
      const outcome = await Promise.race([this.idle.promise, timedOut]);
      clearTimeout(timer);
      if (outcome === "timeout" && this.running.size > 0) {
        this.logger.warn?.(
          `eventbus worker ${this.consumer}: ${this.running.size} handlers still running after ${this.shutdownTimeoutMs} ms, nacked`,
        );
        this.giveUp.abort(new Error(SHUTDOWN_REASON));
        for (const [id, entry] of this.running) {
          entry.abandoned = true;
          if (entry.span) processed(entry.span, "retry", new Error(SHUTDOWN_REASON));
          this.inFlight -= 1;
          this.metrics?.inFlight.dec();
          this.held.delete(id);
          if (this.session !== undefined && entry.session === this.session.id) {
            this.controls.push({ nack: { eventId: id, reason: SHUTDOWN_REASON, delayMs: SHUTDOWN_NACK_DELAY_MS } });
          }
        }
        this.running.clear();
      }
    }
    const current = this.session;
    if (current !== undefined) {
      // Every delivery sent before our drain is then in hand (and released above).
      await Promise.race([current.drained.promise, new Promise((r) => setTimeout(r, CLOSE_TIMEOUT_MS).unref())]);
      this.flush();
      current.call.end();
      // The broker ends the stream once it has read our last request: every ack and nack
      // sent is then applied.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        current.ended.promise,
        new Promise((r) => {
          timer = setTimeout(r, CLOSE_TIMEOUT_MS);
        }),
      ]);
      clearTimeout(timer);
      if (!current.ended.settled) {
        current.call.cancel();
        this.endSession(current, undefined);
      }
    }
    this.held.clear();
    if (this.flushTimer !== undefined) clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
  }
}
