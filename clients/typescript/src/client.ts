// `Client`: one gRPC channel to eventbusd, with publish, subscribe and the admin calls.
//
// Every call carries the bearer token (if any) as `authorization: Bearer <token>`
// metadata, and every gRPC failure surfaces as a typed `EventBusError` subclass.
import { readFile } from "node:fs/promises";

import {
  type CallOptions,
  type ChannelCredentials,
  type ChannelOptions,
  type ClientUnaryCall,
  Metadata,
  type ServiceError,
  credentials as grpcCredentials,
  status as Status,
} from "@grpc/grpc-js";
import { context } from "@opentelemetry/api";

import {
  AckMode,
  AdminClient,
  type Backoff as BackoffConfig,
  BackoffKind,
  type ChannelStats,
  ConsumerConfig,
  type ConsumerInfo,
  EventBusClient,
  type EventLogEntry,
  EventStatus,
  type GetChannelHistoryResponse,
  type GetStatsResponse,
  type ListEventLogResponse,
  type ListPendingResponse,
  type PendingEntry,
  type PublishAck,
  PublishRequest,
  type PublishResponse,
  PushEnvelope,
  type RedriveResponse,
  type SubscriptionInfo,
} from "./gen/eventbus/v1/eventbus.js";
import type { Timestamp } from "./gen/google/protobuf/timestamp.js";
import { Cancelled, EventBusError, Unavailable, fromServiceError, fromStatus } from "./errors.js";
import { SharedPublisher } from "./publisher.js";
import { StreamSends, asError, endSend, startSend, traced } from "./tracing.js";
import { Subscription, type SubscribeOptions } from "./subscription.js";
import { type Payload, Semaphore, dateToTimestamp, toBytes } from "./util.js";

/** PEM material: the PEM text itself (a string containing `-----BEGIN`), a file path, or bytes. */
export type PemSource = string | Uint8Array;

export interface TlsOptions {
  /** CA that signed the server certificate (default: the system roots). */
  ca?: PemSource;
  /** Client certificate chain, for mutual TLS. */
  cert?: PemSource;
  /** The client certificate's private key, for mutual TLS. */
  key?: PemSource;
  /** Name to check the server certificate against, when it differs from the URL's host. */
  serverName?: string;
}

export interface ConnectOptions {
  /** Bearer token sent with every call (`authorization: Bearer <token>`). */
  token?: string;
  /** TLS settings; `true` or an `https://` URL turns TLS on with the system roots. */
  tls?: TlsOptions | boolean;
  /** Default deadline of unary calls, in milliseconds (default 30,000; 0: none). */
  timeoutMs?: number;
  /** Wait this long for the first connection, then fail with `Unavailable` (default 10,000; 0: do not wait). */
  connectTimeoutMs?: number;
  /** Extra gRPC channel options (`grpc.*` keys), merged over this package's defaults. */
  channelOptions?: ChannelOptions;
  /**
   * `publish` makes one unary `Publish` call per event instead of sharing the client's
   * `PublishStream` (default false).
   */
  unaryPublish?: boolean;
  /**
   * How long the shared publish stream waits for more calls to send together while
   * earlier ones are unanswered, in milliseconds (default 0: each call is sent at once).
   */
  publishLingerMs?: number;
}

/** One event to publish (`publishBatch`, `publishStream`). */
export interface PublishInput {
  /** Exact channel (no wildcards, not starting with `$`). */
  channel: string;
  /** Bytes, or a string sent as UTF-8. */
  payload?: Payload;
  metadata?: Record<string, string>;
  contentType?: string;
  /** Empty: the broker records the peer address. */
  source?: string;
  /** Durable consumers deliver a key's events one at a time, in order. */
  orderingKey?: string;
  /** A key seen within the broker's dedup window makes this publish a no-op (`duplicate`). */
  idempotencyKey?: string;
}

/**
 * Options of `Client.publish`: the event's fields other than channel and payload, an
 * abort signal, and the call's deadline (`timeoutMs`, default the client's `timeoutMs`).
 */
export type PublishOptions = Omit<PublishInput, "channel" | "payload"> & { signal?: AbortSignal; timeoutMs?: number };

/** What a `publishStream` publisher waits for: see the proto's `PublishStream`. */
export type AckModeName = "each" | "cumulative" | "none";

export interface PublishStreamOptions {
  /**
   * `each` (default): one `PublishResponse` per event, in order; a refused event ends the
   * stream with its error. `cumulative`: running totals (`PublishAck`) per chunk the broker
   * read, and a `PublishRefused` per refused event. `none`: only the `PublishRefused`s and
   * the final totals.
   */
  ack?: AckModeName;
  /** At most this many events unanswered at a time (default 1,024; 0: no bound). Not with `none`. */
  window?: number;
  /** Aborting cancels the stream (what was sent may or may not be published). */
  signal?: AbortSignal;
}

/**
 * Yielded by `publishStream` with `ack: "cumulative"` or `"none"`: the event at `position`
 * (counted from 0, in the order sent) was refused with `error`; the ones after it were
 * published all the same.
 */
export class PublishRefused {
  constructor(
    readonly position: number,
    readonly error: EventBusError,
  ) {}
}

/** Redelivery backoff of a consumer (broker defaults for what is left out). */
export interface ConsumerBackoffOptions {
  /** 0 = 1,000. */
  initialMs?: number | bigint;
  /** 0 = 2.0. */
  multiplier?: number;
  /** 0 = 60,000. */
  maxMs?: number | bigint;
  /** `exponential` (default) or `linear` (`initialMs × n`). */
  kind?: "exponential" | "linear" | BackoffKind;
}

/** A push consumer's endpoint: the broker POSTs the events to it (docs/push.md). */
export interface PushOptions {
  /** http:// or https:// URL, without credentials. */
  url: string;
  /** Extra request headers (shown back as "(redacted)"). */
  headers?: Record<string, string>;
  /** 0 = 10,000. */
  timeoutMs?: number | bigint;
  /** Requests each instance keeps open to the endpoint; 0 = 16. */
  maxConcurrency?: number;
  /** Events per request; above 1 needs the `json` envelope. */
  batch?: number;
  /** `raw` (default: the payload is the body) or `json`. */
  envelope?: "raw" | "json" | PushEnvelope;
  /** Key of the `eventbus-signature` HMAC header (shown back as "(redacted)"). */
  secret?: string;
}

/** A durable consumer's definition; zero values and omissions take the broker defaults. */
export interface ConsumerOptions {
  /** Time a client has to ack a delivery (0 = 30,000). */
  ackDeadlineMs?: number | bigint;
  /** Failed attempts before dead-lettering: omitted = 5, 0 = unlimited. */
  maxAttempts?: number;
  backoff?: ConsumerBackoffOptions;
  /** Unacknowledged events one client may hold (0 = 1,000). */
  maxInFlight?: number;
  /** Where dead letters go; empty = "dlq." + the event's channel. */
  deadLetterChannel?: string;
  /** One attached client receives at a time. */
  exclusive?: boolean;
  /** Most unfinished events kept: omitted = 1,000,000, 0 = unlimited. */
  maxPending?: number | bigint;
  /** Set: the broker POSTs the events to this HTTP endpoint itself. */
  push?: PushOptions;
}

/** A `ConsumerConfig` message (for `createConsumer`, or a `Worker`'s `createIfMissing`). */
export function consumerConfig(name: string, channels: string | string[], options: ConsumerOptions = {}): ConsumerConfig {
  const backoff: BackoffConfig | undefined = options.backoff
    ? {
        initialMs: BigInt(options.backoff.initialMs ?? 0),
        multiplier: options.backoff.multiplier ?? 0,
        maxMs: BigInt(options.backoff.maxMs ?? 0),
        kind:
          options.backoff.kind === "linear"
            ? BackoffKind.BACKOFF_KIND_LINEAR
            : options.backoff.kind === "exponential" || options.backoff.kind === undefined
              ? BackoffKind.BACKOFF_KIND_EXPONENTIAL
              : options.backoff.kind,
      }
    : undefined;
  const push = options.push;
  return ConsumerConfig.fromPartial({
    name,
    channels: typeof channels === "string" ? [channels] : [...channels],
    ackDeadlineMs: BigInt(options.ackDeadlineMs ?? 0),
    maxAttempts: options.maxAttempts,
    backoff,
    maxInFlight: options.maxInFlight ?? 0,
    deadLetterChannel: options.deadLetterChannel ?? "",
    exclusive: options.exclusive ?? false,
    maxPending: options.maxPending === undefined ? undefined : BigInt(options.maxPending),
    push: push
      ? {
          url: push.url,
          headers: { ...(push.headers ?? {}) },
          timeoutMs: BigInt(push.timeoutMs ?? 0),
          maxConcurrency: push.maxConcurrency ?? 0,
          batch: push.batch ?? 0,
          envelope:
            push.envelope === "json"
              ? PushEnvelope.PUSH_ENVELOPE_JSON
              : push.envelope === "raw" || push.envelope === undefined
                ? PushEnvelope.PUSH_ENVELOPE_RAW
                : push.envelope,
          secret: push.secret ?? "",
        }
      : undefined,
  });
}

/** A `PublishRequest` message from a `PublishInput` (a string payload is sent as UTF-8). */
export function publishRequest(input: PublishInput): PublishRequest {
  return {
    channel: input.channel,
    payload: toBytes(input.payload),
    metadata: { ...(input.metadata ?? {}) },
    contentType: input.contentType ?? "",
    source: input.source ?? "",
    orderingKey: input.orderingKey ?? "",
    idempotencyKey: input.idempotencyKey ?? "",
    ack: AckMode.ACK_MODE_UNSPECIFIED,
  };
}

const ACK_MODES: Record<AckModeName, AckMode> = {
  each: AckMode.ACK_MODE_EACH,
  cumulative: AckMode.ACK_MODE_CUMULATIVE,
  none: AckMode.ACK_MODE_NONE,
};

// The channel reconnects by itself; its own backoff stays short so that our capped
// backoff (subscribe, Worker) decides how fast we come back after a broker restart.
const CHANNEL_OPTIONS: ChannelOptions = {
  "grpc.max_receive_message_length": -1,
  "grpc.max_send_message_length": -1,
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 2000,
  "grpc.keepalive_time_ms": 30_000,
  "grpc.keepalive_timeout_ms": 10_000,
};

async function readPem(src: PemSource | undefined): Promise<Buffer | null> {
  if (src === undefined) return null;
  if (typeof src !== "string") return Buffer.from(src);
  if (src.includes("-----BEGIN")) return Buffer.from(src, "utf8");
  return readFile(src);
}

/** `http://h:p`, `https://h:p` or `h:p` → the gRPC target and whether the URL asks for TLS. */
function parseUrl(url: string): { target: string; tls: boolean } {
  const trimmed = url.replace(/\/+$/, "");
  if (trimmed.startsWith("https://")) return { target: trimmed.slice("https://".length), tls: true };
  if (trimmed.startsWith("http://")) return { target: trimmed.slice("http://".length), tls: false };
  return { target: trimmed, tls: false };
}

type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/**
 * A connection to eventbusd: `await Client.connect(url)`, then `close()`. Cheap to share
 * across the whole process (one HTTP/2 connection, many concurrent calls).
 */
export class Client {
  /** Raw generated client of the EventBus service (pass `client.metadata()` to its calls). */
  readonly bus: EventBusClient;
  /** Raw generated client of the Admin service, on the same channel. */
  readonly admin: AdminClient;
  /** The URL given to `connect`. */
  readonly url: string;
  private readonly token: string | undefined;
  private readonly timeoutMs: number;
  /** The stream `publish` shares; undefined with `unaryPublish`. */
  private readonly publisher: SharedPublisher | undefined;

  private constructor(url: string, bus: EventBusClient, admin: AdminClient, token: string | undefined, options: ConnectOptions) {
    this.url = url;
    this.bus = bus;
    this.admin = admin;
    this.token = token;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.publisher = options.unaryPublish
      ? undefined
      : new SharedPublisher(bus, () => this.metadata(), options.publishLingerMs ?? 0, options.connectTimeoutMs || 10_000);
  }

  /**
   * Connects to `url` (`http://host:port`, `https://host:port` for TLS, or `host:port`) and
   * waits for the connection (`connectTimeoutMs`), failing with `Unavailable`.
   */
  static async connect(url: string, options: ConnectOptions = {}): Promise<Client> {
    const { target, tls: urlTls } = parseUrl(url);
    const tls = typeof options.tls === "object" ? options.tls : options.tls || urlTls ? {} : undefined;
    let creds: ChannelCredentials;
    const channelOptions: ChannelOptions = { ...CHANNEL_OPTIONS, ...(options.channelOptions ?? {}) };
    if (tls !== undefined) {
      creds = grpcCredentials.createSsl(await readPem(tls.ca), await readPem(tls.key), await readPem(tls.cert));
      if (tls.serverName) channelOptions["grpc.ssl_target_name_override"] = tls.serverName;
    } else {
      creds = grpcCredentials.createInsecure();
    }
    const bus = new EventBusClient(target, creds, channelOptions);
    const admin = new AdminClient(target, creds, { ...channelOptions, channelOverride: bus.getChannel() });
    const client = new Client(url, bus, admin, options.token, options);
    const wait = options.connectTimeoutMs ?? 10_000;
    if (wait > 0) {
      try {
        await new Promise<void>((resolve, reject) =>
          bus.waitForReady(Date.now() + wait, (err) => (err ? reject(err) : resolve())),
        );
      } catch {
        client.close();
        throw new Unavailable(`UNAVAILABLE: cannot connect to ${url} within ${wait} ms`, Status.UNAVAILABLE);
      }
    }
    return client;
  }

  /** Closes the channel; open calls and streams end. */
  close(): void {
    this.publisher?.close();
    this.bus.close();
  }

  /** Call metadata: the bearer token, and `extra` entries. */
  metadata(extra: Record<string, string> = {}): Metadata {
    const md = new Metadata();
    if (this.token) md.set("authorization", `Bearer ${this.token}`);
    for (const [k, v] of Object.entries(extra)) md.set(k, v);
    return md;
  }

  private unary<Req, Res>(
    method: UnaryMethod<Req, Res>,
    target: object,
    request: Req,
    signal?: AbortSignal,
    timeoutMs = this.timeoutMs,
  ): Promise<Res> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<Res>((resolve, reject) => {
      const options: Partial<CallOptions> = timeoutMs > 0 ? { deadline: Date.now() + timeoutMs } : {};
      const onAbort = (): void => call.cancel();
      const call = method.call(target, request, this.metadata(), options, (err, response) => {
        signal?.removeEventListener("abort", onAbort);
        if (err) reject(signal?.aborted ? signal.reason : fromServiceError(err));
        else resolve(response);
      });
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  // --- publishing ---

  /**
   * Publishes one event; answers once it is offered to every subscription and stored for
   * every matching durable consumer.
   *
   * Concurrent calls share one `PublishStream` per client: each call is sent as soon as the
   * stream can take it, together with the calls that came meanwhile, and gets its own answer
   * or its own error (a refused event fails its own call only). Should the stream be lost
   * before an event is answered, the call rejects with `Unavailable` (the event may or may
   * not be published), unless it has an `idempotencyKey`: then it is sent again, and the
   * broker answers a duplicate with the original id. Past `timeoutMs` (default the client's)
   * the call rejects with `DeadlineExceeded`, and after `signal` aborts with its reason; an
   * event not yet sent then is never sent. `connect(url, { unaryPublish: true })` makes one
   * unary `Publish` call per event instead.
   */
  publish(channel: string, payload?: Payload, options: PublishOptions = {}): Promise<PublishResponse> {
    const { signal, timeoutMs, ...fields } = options;
    const request = publishRequest({ ...fields, channel, payload });
    return traced(request, (request) => {
      if (this.publisher === undefined) return this.unary(this.bus.publish, this.bus, request, signal, timeoutMs);
      return this.publisher.publish(request, timeoutMs ?? this.timeoutMs, signal);
    });
  }

  /**
   * Publishes several events in one call (`PublishBatch`): in their order, many times
   * cheaper than one `publish` each. Resolves to one result per event, in order: the
   * `PublishResponse`, or for an event the broker refused its typed error (returned, not
   * thrown: the others are published all the same). Rejects only for the whole call (more
   * than the broker's `max_publish_batch` events, over its read limit or the caller's rate,
   * bad credentials, broker unavailable).
   */
  async publishBatch(
    events: Iterable<PublishInput>,
    options: { signal?: AbortSignal } = {},
  ): Promise<Array<PublishResponse | EventBusError>> {
    const requests = Array.from(events, publishRequest);
    // One `send` span per event, each event carrying its own.
    const parent = context.active();
    const spans = requests.map((request) => startSend(request, parent));
    let answers: Array<PublishResponse | EventBusError>;
    try {
      const response = await this.unary(this.bus.publishBatch, this.bus, { events: requests }, options.signal);
      if (response.results.length !== requests.length) {
        throw new EventBusError(`PublishBatch of ${requests.length} events answered with ${response.results.length} results`);
      }
      answers = response.results.map((r) => (r.error ? fromStatus(r.error.code, r.error.message) : r));
    } catch (err) {
      for (const span of spans) endSend(span, err instanceof Error ? err : new Error(String(err)));
      throw err;
    }
    spans.forEach((span, i) => endSend(span, answers[i]));
    return answers;
  }

  /**
   * Publishes a stream of events, pipelined on one `PublishStream` (events of one stream
   * reach each subscription in the order sent). What it yields depends on `ack`:
   * - `"each"` (default): one `PublishResponse` per event, in order; a refused event ends
   *   the stream with its error (the events before it stay published).
   * - `"cumulative"`: a `PublishAck` (running totals: `count` accepted, `refused`,
   *   `lastEventId`...) per chunk the broker read, and a `PublishRefused` per refused event.
   * - `"none"`: only the `PublishRefused`s, then the final totals.
   * With `cumulative` and `none` the last item is a `PublishAck` with `end` set: the
   * stream's totals. At most `window` events are unanswered at a time (with `none` nothing
   * is answered before the end, so only HTTP/2 flow control paces the sender).
   */
  publishStream(
    events: Iterable<PublishInput> | AsyncIterable<PublishInput>,
    options?: PublishStreamOptions & { ack?: "each" },
  ): AsyncIterable<PublishResponse>;
  publishStream(
    events: Iterable<PublishInput> | AsyncIterable<PublishInput>,
    options: PublishStreamOptions & { ack: "cumulative" | "none" },
  ): AsyncIterable<PublishAck | PublishRefused>;
  publishStream(
    events: Iterable<PublishInput> | AsyncIterable<PublishInput>,
    options?: PublishStreamOptions,
  ): AsyncIterable<PublishResponse | PublishAck | PublishRefused>;
  publishStream(
    events: Iterable<PublishInput> | AsyncIterable<PublishInput>,
    options: PublishStreamOptions = {},
  ): AsyncIterable<PublishResponse | PublishAck | PublishRefused> {
    const ack = options.ack ?? "each";
    if (!(ack in ACK_MODES)) {
      throw new TypeError(`ack must be one of ${Object.keys(ACK_MODES).join(", ")}, not ${JSON.stringify(ack)}`);
    }
    // Each event's `send` span is a child of the context active here, not wherever the
    // stream is first read.
    return this.runPublishStream(events, ack, options.window ?? 1024, options.signal, new StreamSends());
  }

  private async *runPublishStream(
    events: Iterable<PublishInput> | AsyncIterable<PublishInput>,
    ack: AckModeName,
    window: number,
    signal: AbortSignal | undefined,
    sends: StreamSends,
  ): AsyncGenerator<PublishResponse | PublishAck | PublishRefused> {
    signal?.throwIfAborted();
    const room = window > 0 && ack !== "none" ? new Semaphore(window) : undefined;
    // The mode goes in the first request and, for a stream with no event at all, in the
    // call's metadata too (the two agree).
    const call = this.bus.publishStream(this.metadata(ack === "each" ? {} : { "eventbus-ack": ack }));
    call.on("error", () => {}); // reported through the iterator below
    let finished = false;
    let writerError: unknown;
    const onAbort = (): void => call.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });

    const writer = async (): Promise<void> => {
      let first = true;
      for await (const input of events) {
        if (finished) return;
        if (room && !(await room.acquire())) return;
        if (finished) return;
        const request = publishRequest(input);
        sends.start(request);
        if (first) {
          request.ack = ACK_MODES[ack];
          first = false;
        }
        if (!call.write(request)) {
          await new Promise<void>((resolve) => {
            const done = (): void => {
              call.off("drain", done);
              call.off("close", done);
              call.off("error", done);
              resolve();
            };
            call.on("drain", done);
            call.on("close", done);
            call.on("error", done);
          });
        }
      }
      if (!finished) call.end();
    };
    writer().catch((err: unknown) => {
      writerError = err;
      call.cancel();
    });

    let covered = 0n; // events answered so far, for the window
    try {
      for await (const response of call as AsyncIterable<PublishResponse>) {
        if (response.ack) {
          const answered = response.ack.count + response.ack.refused;
          if (room && answered > covered) room.release(Number(answered - covered));
          if (answered > covered) covered = answered;
          sends.covered(Number(answered));
          yield response.ack;
        } else if (response.error) {
          const refused = new PublishRefused(Number(response.position), fromStatus(response.error.code, response.error.message));
          sends.refused(refused.position, refused.error);
          yield refused;
        } else {
          room?.release();
          sends.answered(response);
          yield response;
        }
      }
    } catch (err) {
      const failure = writerError ?? (signal?.aborted ? signal.reason : fromServiceError(err));
      sends.failed(asError(failure));
      throw failure;
    } finally {
      if (sends.unanswered) {
        // The events' source failed, or the caller closed the stream, before the broker
        // answered the rest.
        const closed = "CANCELLED: the publish stream was closed before this event's answer was read";
        sends.failed(writerError !== undefined ? asError(writerError) : new Cancelled(closed, Status.CANCELLED));
      }
      finished = true;
      room?.close();
      signal?.removeEventListener("abort", onAbort);
      call.cancel();
    }
    if (writerError !== undefined) throw writerError;
  }

  // --- subscribing ---

  /**
   * Subscribes to channels and patterns; iterate the result with `for await`. It starts at
   * once; `await sub.started()` waits until it is live. It yields `Event`s and re-subscribes
   * by itself when the stream breaks (broker restart, network, slow-consumer disconnect),
   * recovering what it missed on channels that keep history; it yields a `Gap` when the
   * broker could not give back everything (always with a `group`). Ends after
   * `Admin.Unsubscribe`, `sub.close()`, `break`, or when `signal` aborts.
   */
  subscribe(channels: string | string[], options: SubscribeOptions = {}): Subscription {
    return new Subscription(this, typeof channels === "string" ? [channels] : [...channels], options);
  }

  // --- admin ---

  /** Broker-wide totals since it started. */
  stats(options: { signal?: AbortSignal } = {}): Promise<GetStatsResponse> {
    return this.unary(this.admin.getStats, this.admin, {}, options.signal);
  }

  /** Channels the broker has seen published, with their counters. */
  async channels(options: { signal?: AbortSignal } = {}): Promise<ChannelStats[]> {
    return (await this.unary(this.admin.listChannels, this.admin, {}, options.signal)).channels;
  }

  /** Open subscriptions with their queues and counters. */
  async subscriptions(options: { signal?: AbortSignal } = {}): Promise<SubscriptionInfo[]> {
    return (await this.unary(this.admin.listSubscriptions, this.admin, {}, options.signal)).subscriptions;
  }

  /** Closes a subscription: its stream ends normally (its iterator ends). */
  async unsubscribe(subscriptionId: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.unary(this.admin.unsubscribe, this.admin, { subscriptionId }, options.signal);
  }

  /**
   * Creates a durable consumer: from now on every matching publish is kept for it.
   * Idempotent for an identical definition; `AlreadyExists` for a different one. With
   * `push`, the broker itself POSTs the events to an HTTP endpoint.
   */
  createConsumer(
    name: string,
    channels: string | string[],
    options: ConsumerOptions & { signal?: AbortSignal } = {},
  ): Promise<ConsumerInfo> {
    return this.unary(this.admin.createConsumer, this.admin, { config: consumerConfig(name, channels, options) }, options.signal);
  }

  /** One consumer's state; `NotFound` when unknown. */
  getConsumer(name: string, options: { signal?: AbortSignal } = {}): Promise<ConsumerInfo> {
    return this.unary(this.admin.getConsumer, this.admin, { name }, options.signal);
  }

  /** Every consumer's state. */
  async listConsumers(options: { signal?: AbortSignal } = {}): Promise<ConsumerInfo[]> {
    return (await this.unary(this.admin.listConsumers, this.admin, {}, options.signal)).consumers;
  }

  /** Deletes a consumer, the events it holds and its log; attached clients are detached. */
  async deleteConsumer(name: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.unary(this.admin.deleteConsumer, this.admin, { name }, options.signal);
  }

  /** One page of a consumer's terminal log, oldest first (`limit` 0 = 100, at most 1,000). */
  eventLog(
    consumer: string,
    options: { status?: EventStatus; limit?: number; pageToken?: string; signal?: AbortSignal } = {},
  ): Promise<ListEventLogResponse> {
    return this.unary(
      this.admin.listEventLog,
      this.admin,
      {
        consumer,
        status: options.status ?? EventStatus.EVENT_STATUS_UNSPECIFIED,
        limit: options.limit ?? 0,
        pageToken: options.pageToken ?? "",
      },
      options.signal,
    );
  }

  /** Every entry of a consumer's terminal log, following the pages. */
  async *eventLogAll(consumer: string, options: { status?: EventStatus; signal?: AbortSignal } = {}): AsyncGenerator<EventLogEntry> {
    let pageToken = "";
    do {
      const page = await this.eventLog(consumer, { ...options, limit: 1000, pageToken });
      yield* page.entries;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /**
   * One page of a consumer's unfinished events, each with its attempt, next delivery,
   * failures and `state` (`PendingState`); `limit` 0 = 100, at most 1,000.
   */
  listPending(
    consumer: string,
    options: { limit?: number; pageToken?: string; signal?: AbortSignal } = {},
  ): Promise<ListPendingResponse> {
    return this.unary(
      this.admin.listPending,
      this.admin,
      { consumer, limit: options.limit ?? 0, pageToken: options.pageToken ?? "" },
      options.signal,
    );
  }

  /** Every unfinished event of a consumer, following the pages. */
  async *listPendingAll(consumer: string, options: { signal?: AbortSignal } = {}): AsyncGenerator<PendingEntry> {
    let pageToken = "";
    do {
      const page = await this.listPending(consumer, { ...options, limit: 1000, pageToken });
      yield* page.entries;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  /**
   * Puts dead-lettered events back to the consumer with attempts reset: those named, or
   * with none named the oldest `limit` (0 = 10,000). Answers `redriven` and `remaining`.
   */
  redrive(
    consumer: string,
    options: { eventIds?: string[]; limit?: number; signal?: AbortSignal } = {},
  ): Promise<RedriveResponse> {
    return this.unary(
      this.admin.redriveDeadLetters,
      this.admin,
      { consumer, eventIds: [...(options.eventIds ?? [])], limit: options.limit ?? 0 },
      options.signal,
    );
  }

  /** Stops delivery: events are still captured; attached clients stay and may ack. */
  pause(name: string, options: { signal?: AbortSignal } = {}): Promise<ConsumerInfo> {
    return this.unary(this.admin.pauseConsumer, this.admin, { name }, options.signal);
  }

  /** Delivers again after `pause`. */
  resume(name: string, options: { signal?: AbortSignal } = {}): Promise<ConsumerInfo> {
    return this.unary(this.admin.resumeConsumer, this.admin, { name }, options.signal);
  }

  /**
   * A channel's history (channels matching an `eventbus.history` rule): what it holds and a
   * page of its events, oldest first, after `afterOffset` or from `since`; `NotFound` when
   * no rule covers the channel.
   */
  channelHistory(
    channel: string,
    options: { afterOffset?: number | bigint; since?: Date | Timestamp; limit?: number; signal?: AbortSignal } = {},
  ): Promise<GetChannelHistoryResponse> {
    const since = options.since instanceof Date ? dateToTimestamp(options.since) : options.since;
    return this.unary(
      this.admin.getChannelHistory,
      this.admin,
      { channel, afterOffset: BigInt(options.afterOffset ?? 0), since, limit: options.limit ?? 0 },
      options.signal,
    );
  }
}
