// Socle EventBus client for Node.js.
//
// - `Client`: connect (token, TLS), `publish`, `publishBatch`, `publishStream` (ack modes
//   each, cumulative, none), `subscribe` (reconnects by itself, recovers what it missed on
//   channels with history, and yields a `Gap` when it could not), admin calls.
// - `Worker`: the push worker for durable consumers (handler → Ack / Retry / Term).
// - Errors: `EventBusError` and one subclass per gRPC status code callers branch on.
// - `pb`: the messages and service clients generated from proto/eventbus/v1/eventbus.proto
//   when the package was built (`pb.DeadLetter.decode(event.payload)`, ...).
export {
  Client,
  PublishRefused,
  consumerConfig,
  publishRequest,
  type AckModeName,
  type ConnectOptions,
  type ConsumerBackoffOptions,
  type ConsumerOptions,
  type PemSource,
  type PublishInput,
  type PublishOptions,
  type PublishStreamOptions,
  type PushOptions,
  type TlsOptions,
} from "./client.js";
export {
  Gap,
  MAX_SINCE_CHANNELS,
  Subscription,
  isGap,
  type PositionLike,
  type Since,
  type SubscribeOptions,
  type SubscriptionItem,
} from "./subscription.js";
export {
  Ack,
  Retry,
  SHUTDOWN_REASON,
  Term,
  Worker,
  type Delivery,
  type Handler,
  type HandlerContext,
  type Outcome,
  type WorkerOptions,
  type WorkerStats,
} from "./worker.js";
export {
  AlreadyExists,
  Cancelled,
  DeadlineExceeded,
  EventBusError,
  FailedPrecondition,
  Internal,
  InvalidArgument,
  NotFound,
  PermissionDenied,
  ResourceExhausted,
  Unauthenticated,
  Unavailable,
  fromServiceError,
  fromStatus,
  isTransient,
} from "./errors.js";
export { Backoff, dateToTimestamp, timestampToDate, type Logger, type Payload } from "./util.js";

export * as pb from "./gen/eventbus/v1/eventbus.js";
export {
  AckMode,
  BackoffKind,
  DeadLetter,
  EventStatus,
  OverflowPolicy,
  PendingState,
  PushEnvelope,
  type ChannelHistory,
  type ChannelStats,
  type ConsumerConfig,
  type ConsumerInfo,
  type Event,
  type EventLogEntry,
  type EventPosition,
  type Failure,
  type GetChannelHistoryResponse,
  type GetStatsResponse,
  type PendingEntry,
  type PublishAck,
  type PublishResponse,
  type RedriveResponse,
  type SubscriptionInfo,
} from "./gen/eventbus/v1/eventbus.js";
export type { Timestamp } from "./gen/google/protobuf/timestamp.js";
