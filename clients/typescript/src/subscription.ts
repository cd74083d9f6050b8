// `Subscription`: the reconnecting, recovering core subscriber returned by
// `Client.subscribe`.
//
// It tracks, per channel that keeps history, the position of the last event it yielded,
// and re-subscribes from there (`SubscribeRequest.since`) after a break; the broker then
// sends what was missed first, in order, then the live events, none twice. A `Gap` is
// yielded only when that recovery was incomplete (`started.recovered` false after a
// re-subscription: no history, history trimmed or lost, or a group).
import type { ClientReadableStream } from "@grpc/grpc-js";

import type { Client } from "./client.js";
import { EventBusError, ResourceExhausted, fromServiceError, isTransient } from "./errors.js";
import type {
  Event,
  EventPosition,
  OverflowPolicy,
  SubscribeRequest,
  SubscribeResponse,
  SubscriptionStarted,
} from "./gen/eventbus/v1/eventbus.js";
import type { Timestamp } from "./gen/google/protobuf/timestamp.js";
import { Backoff, dateToTimestamp, sleep, timestampToDate } from "./util.js";

/** Most channels one `SubscribeRequest.since` may name (the broker's limit). */
export const MAX_SINCE_CHANNELS = 1024;

/** A channel position: an `EventPosition`, or an `[epoch, offset]` pair. */
export type PositionLike = EventPosition | { epoch: string; offset: number | bigint } | readonly [string, number | bigint];

/**
 * Where a subscription resumes from: the events after each channel's position in
 * `positions` (the last event already had), and for its other channels that keep history
 * those published at or after `time`. `Subscription.since` is the point a subscription has
 * reached, to pass to a later `subscribe(..., { since })`.
 */
export interface Since {
  positions?: Record<string, PositionLike> | ReadonlyMap<string, PositionLike>;
  time?: Date | Timestamp;
}

export interface SubscribeOptions {
  /** Subscriptions of one group share the events, each going to one member. */
  group?: string;
  /** Queue size in events (0: the broker default). */
  queueCapacity?: number;
  /** What the broker does when the queue is full (default: its configured policy). */
  overflow?: OverflowPolicy;
  /** Most events per message (0: the broker default). */
  maxBatch?: number;
  /** Label shown in `subscriptions()`. */
  name?: string;
  /** Queue bound in bytes (0: the broker default). */
  maxQueueBytes?: number | bigint;
  /** Re-subscribe by itself when the stream breaks (default true); false: the error is thrown. */
  reconnect?: boolean;
  /** Delays between re-subscriptions (default 100 ms doubling to 5 s, ±20%). */
  backoff?: Backoff | { initialMs?: number; maxMs?: number; multiplier?: number };
  /** Start by recovering from there: a `Since`, or a time. Not with `group`. */
  since?: Since | Date;
  /** Aborting ends the subscription, like `close()`. */
  signal?: AbortSignal;
}

/**
 * Yielded after a re-subscription that could not recover everything (channels without
 * history, history trimmed or lost, or a `group`): events published between `lostAt` and
 * `resumedAt` may have been missed.
 */
export class Gap {
  constructor(
    /** Why the stream broke. */
    readonly reason: string,
    readonly lostAt: Date,
    readonly resumedAt: Date,
    /** Re-subscriptions so far, this one included. */
    readonly reconnects: number,
  ) {}
}

/** What a subscription yields. */
export type SubscriptionItem = Event | Gap;

/** True for a `Gap` (a type guard: otherwise the item is an `Event`). */
export function isGap(item: SubscriptionItem): item is Gap {
  return item instanceof Gap;
}

function toPosition(p: PositionLike): EventPosition {
  let epoch: unknown;
  let offset: unknown;
  if (Array.isArray(p)) {
    [epoch, offset] = p as readonly unknown[];
  } else {
    ({ epoch, offset } = p as { epoch: unknown; offset: unknown });
  }
  if (typeof epoch !== "string" || (typeof offset !== "number" && typeof offset !== "bigint") || offset < 0) {
    throw new TypeError(`a position is an EventPosition or an [epoch: string, offset: number] pair, not ${String(p)}`);
  }
  return { epoch, offset: BigInt(offset) };
}

function copyTimestamp(t: Date | Timestamp): Timestamp {
  return t instanceof Date ? dateToTimestamp(t) : { seconds: t.seconds, nanos: t.nanos };
}

/**
 * The async iterable returned by `Client.subscribe`: `Event`s and `Gap`s. It runs from
 * its creation until `close()` (or `break` out of `for await`, or its `signal`): one reader
 * at a time. It reads a batch ahead of the consumer at most; further events wait in the
 * broker's queue for this subscription (its overflow policy applies).
 */
export class Subscription implements AsyncIterable<SubscriptionItem> {
  /** Id of the current server-side subscription (changes on each re-subscription). */
  id: string | undefined;
  /** Re-subscriptions made so far. */
  reconnects = 0;
  /**
   * `recovered` of the current server-side subscription: true when it was asked to recover
   * (a `since`, or a re-subscription) and everything asked for was; false otherwise;
   * undefined before the first start.
   */
  recovered: boolean | undefined;

  private readonly client: Client;
  private readonly request: SubscribeRequest;
  private readonly reconnect: boolean;
  private readonly backoff: Backoff;
  // Last position per channel, the most recently updated last.
  private readonly tracked = new Map<string, EventPosition>();
  private readonly sinceTime: Timestamp | undefined;
  private firstStartedAt: Timestamp | undefined;
  // Tracked channels left out of the current request's `since` (over the broker's limit):
  // resumed by time, so what was already yielded is skipped here.
  private unsent = new Set<string>();

  private readonly stopper = new AbortController();
  private call: ClientReadableStream<SubscribeResponse> | undefined;
  private closed = false;
  private live = false;
  private ended = false;
  private error: EventBusError | undefined; // thrown once by the iterator
  private failure: EventBusError | undefined; // what ended the subscription
  private readonly items: SubscriptionItem[] = [];
  private consumerWaiters: Array<() => void> = [];
  private demandWaiter: (() => void) | undefined;
  private startWaiters: Array<{ resolve: (id: string) => void; reject: (err: unknown) => void }> = [];
  private readonly driver: Promise<void>;

  /** @internal Use `Client.subscribe`. */
  constructor(client: Client, channels: string[], options: SubscribeOptions) {
    this.client = client;
    let since = options.since;
    if (since instanceof Date) since = { time: since };
    if (since !== undefined && options.group) {
      throw new TypeError("since cannot be used with a group: its members share the events");
    }
    this.request = {
      channels,
      group: options.group ?? "",
      queueCapacity: options.queueCapacity ?? 0,
      overflow: options.overflow ?? 0,
      maxBatch: options.maxBatch ?? 0,
      name: options.name ?? "",
      maxQueueBytes: BigInt(options.maxQueueBytes ?? 0),
      since: undefined,
    };
    this.reconnect = options.reconnect ?? true;
    this.backoff = options.backoff instanceof Backoff ? options.backoff : new Backoff(options.backoff);
    const positions = since?.positions;
    if (positions !== undefined) {
      const entries = positions instanceof Map ? positions.entries() : Object.entries(positions);
      for (const [channel, position] of entries as Iterable<[string, PositionLike]>) {
        this.tracked.set(channel, toPosition(position));
      }
    }
    this.sinceTime = since?.time !== undefined ? copyTimestamp(since.time) : undefined;
    const signal = options.signal;
    if (signal?.aborted) this.closed = true;
    const onAbort = (): void => void this.close();
    signal?.addEventListener("abort", onAbort, { once: true });
    this.driver = this.drive().finally(() => signal?.removeEventListener("abort", onAbort));
  }

  [Symbol.asyncIterator](): AsyncIterator<SubscriptionItem> {
    return {
      next: () => this.next(),
      return: async () => {
        await this.close();
        return { done: true, value: undefined };
      },
    };
  }

  /** The next item; `done` once the subscription ended (closed or unsubscribed). */
  async next(): Promise<IteratorResult<SubscriptionItem, undefined>> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        if (this.items.length === 0) this.wakeDriver();
        return { done: false, value: item };
      }
      if (this.ended) {
        const err = this.error;
        if (err !== undefined) {
          this.error = undefined; // thrown once
          throw err;
        }
        return { done: true, value: undefined };
      }
      this.wakeDriver();
      await new Promise<void>((resolve) => this.consumerWaiters.push(resolve));
    }
  }

  /**
   * Waits until the subscription is live (events published from now on are delivered) and
   * resolves with its id; rejects when it ends first (e.g. `Unauthenticated`).
   */
  started(): Promise<string> {
    if (this.live && this.id !== undefined) return Promise.resolve(this.id);
    if (this.ended || this.closed) {
      return Promise.reject(this.failure ?? new EventBusError("the subscription has ended"));
    }
    return new Promise((resolve, reject) => this.startWaiters.push({ resolve, reject }));
  }

  /** Ends the subscription (cancels the stream); the iterator then ends. */
  async close(): Promise<void> {
    this.closed = true;
    this.stopper.abort();
    this.call?.cancel();
    this.wakeDriver();
    await this.driver;
  }

  /**
   * Per channel that keeps history, the position of the last event yielded (or, for an
   * exact channel with none yet, its latest position when the subscription started).
   */
  get positions(): Record<string, EventPosition> {
    const out: Record<string, EventPosition> = {};
    for (const [channel, p] of this.tracked) out[channel] = { epoch: p.epoch, offset: p.offset };
    return out;
  }

  /** Broker time when the subscription first went live; undefined before. */
  get startedAt(): Date | undefined {
    return this.firstStartedAt ? timestampToDate(this.firstStartedAt) : undefined;
  }

  /**
   * Where this subscription stands: what a re-subscription asks to recover from. Pass it
   * to `subscribe(..., { since })` to carry on later from here (its `time` is a
   * `Timestamp`, to the nanosecond).
   */
  get since(): { positions: Record<string, EventPosition>; time: Timestamp | undefined } {
    const time = this.resumeTime();
    return { positions: this.positions, time: time ? copyTimestamp(time) : undefined };
  }

  private resumeTime(): Timestamp | undefined {
    return this.sinceTime ?? this.firstStartedAt;
  }

  /** The request of the next (re-)subscription: with `since` unless in a group. */
  private nextRequest(): SubscribeRequest {
    const req: SubscribeRequest = { ...this.request, since: undefined };
    this.unsent = new Set();
    if (req.group) return req;
    const entries = [...this.tracked.entries()];
    const sent = entries.slice(-MAX_SINCE_CHANNELS);
    const time = this.resumeTime();
    if (sent.length > 0 || time !== undefined) {
      req.since = { positions: Object.fromEntries(sent), timestamp: time };
    }
    if (sent.length < entries.length) {
      this.unsent = new Set(entries.slice(0, entries.length - sent.length).map(([channel]) => channel));
    }
    return req;
  }

  /** Records the event's position; false for a copy of one already yielded. */
  private track(event: Event): boolean {
    const position = event.position;
    if (position === undefined) return true;
    const had = this.tracked.get(event.channel);
    if (had !== undefined && had.epoch === position.epoch && position.offset <= had.offset) {
      return !this.unsent.has(event.channel);
    }
    this.tracked.delete(event.channel);
    this.tracked.set(event.channel, { epoch: position.epoch, offset: position.offset });
    return true;
  }

  private onStarted(req: SubscribeRequest, started: SubscriptionStarted): void {
    this.id = started.subscriptionId;
    this.recovered = started.recovered;
    if (this.firstStartedAt === undefined && started.startedAt !== undefined) {
      this.firstStartedAt = copyTimestamp(started.startedAt);
    }
    // A channel not recovered by time starts from its latest position then.
    if (req.since?.timestamp === undefined) {
      for (const [channel, position] of Object.entries(started.positions)) {
        if (!this.tracked.has(channel)) this.tracked.set(channel, { epoch: position.epoch, offset: position.offset });
      }
    }
  }

  private push(item: SubscriptionItem): void {
    this.items.push(item);
    for (const wake of this.consumerWaiters.splice(0)) wake();
  }

  private wakeDriver(): void {
    const waiter = this.demandWaiter;
    this.demandWaiter = undefined;
    waiter?.();
  }

  /** Waits until the consumer has taken every item read so far (or the subscription closes). */
  private async demand(): Promise<void> {
    while (this.items.length > 0 && !this.closed) {
      await new Promise<void>((resolve) => (this.demandWaiter = resolve));
    }
  }

  private async drive(): Promise<void> {
    let lostAt: Date | undefined;
    let reason = "";
    let failures = 0;
    try {
      while (!this.closed) {
        const req = this.nextRequest();
        const call = this.client.bus.subscribe(req, this.client.metadata());
        call.on("error", () => {}); // reported through the iterator below
        this.call = call;
        try {
          for await (const response of call as AsyncIterable<SubscribeResponse>) {
            if (this.closed) return;
            if (response.events) {
              for (const event of response.events.events) {
                if (this.track(event)) this.push(event);
              }
              await this.demand();
            } else if (response.started) {
              this.onStarted(req, response.started);
              failures = 0;
              if (lostAt !== undefined) {
                this.reconnects += 1;
                const gap = new Gap(reason, lostAt, new Date(), this.reconnects);
                lostAt = undefined;
                if (!response.started.recovered) this.push(gap);
              }
              this.live = true;
              for (const w of this.startWaiters.splice(0)) w.resolve(response.started.subscriptionId);
            }
          }
          return; // ended with OK: unsubscribed
        } catch (e) {
          if (this.closed) return;
          const err = fromServiceError(e);
          if (!this.reconnect || !(isTransient(err) || err instanceof ResourceExhausted)) throw err;
          if (lostAt === undefined && this.id !== undefined) {
            // A gap only once we had started.
            lostAt = new Date();
            reason = err.message;
          }
        } finally {
          call.cancel();
          this.call = undefined;
          this.live = false;
        }
        failures += 1;
        await sleep(this.backoff.delay(failures), this.stopper.signal);
      }
    } catch (e) {
      this.error = this.failure = fromServiceError(e);
    } finally {
      this.ended = true;
      this.live = false;
      const err = this.error ?? new EventBusError("the subscription has ended");
      for (const w of this.startWaiters.splice(0)) w.reject(err);
      for (const wake of this.consumerWaiters.splice(0)) wake();
    }
  }
}
