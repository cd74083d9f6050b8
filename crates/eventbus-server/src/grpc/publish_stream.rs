//! `PublishStream`: requests read ahead a chunk at a time, published together, and
//! answered as the publisher chose (`AckMode`): each event (EACH), running totals per
//! chunk (CUMULATIVE), nothing but refusals (NONE), or each event with refusals in place
//! (EACH_IN_PLACE). In the last three, a refused event is answered on its own with its
//! position and does not stop the stream; CUMULATIVE and NONE end with the totals.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use eventbus_core::Published;
use eventbus_proto::pb;
use futures::{Stream, StreamExt, stream};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status, Streaming};

use super::{EventBusService, RpcStream, caller, peer, publish_error};
use crate::access::CallerWatch;
use crate::convert::trace::TraceContext;
use crate::convert::{self, status};
use crate::metrics::Metrics;

/// Most `PublishStream` requests published together.
pub(crate) const PUBLISH_CHUNK: usize = 256;

/// The call metadata that chooses the ack mode, when the first request does not.
pub(crate) const ACK_METADATA: &str = "eventbus-ack";

/// A `PublishStream`'s answers, before encoding.
pub(crate) type Answers = RpcStream<StreamAnswer>;

/// One answer of a `PublishStream`.
#[derive(Debug, Clone)]
pub(crate) enum StreamAnswer {
    /// An accepted event, in EACH and EACH_IN_PLACE modes.
    Published(Published),
    /// A refused event, in CUMULATIVE, NONE and EACH_IN_PLACE modes.
    Refused { position: u64, error: pb::PublishError },
    /// The stream's running totals, in CUMULATIVE and NONE modes.
    Totals(pb::PublishAck),
}

impl StreamAnswer {
    /// The generated message with the same bytes.
    pub(crate) fn into_pb(self) -> pb::PublishResponse {
        match self {
            Self::Published(p) => convert::publish_response(p),
            Self::Refused { position, error } => {
                pb::PublishResponse { error: Some(error), position, ..Default::default() }
            }
            Self::Totals(ack) => pb::PublishResponse { ack: Some(ack), ..Default::default() },
        }
    }
}

/// What a publisher waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckMode {
    Each,
    Cumulative,
    None,
    EachInPlace,
}

impl AckMode {
    /// The mode of a request's `ack` field; `None` when it is not set.
    fn from_request(value: i32) -> Result<Option<Self>, Status> {
        match pb::AckMode::try_from(value) {
            Ok(pb::AckMode::Unspecified) => Ok(None),
            Ok(pb::AckMode::Each) => Ok(Some(Self::Each)),
            Ok(pb::AckMode::Cumulative) => Ok(Some(Self::Cumulative)),
            Ok(pb::AckMode::None) => Ok(Some(Self::None)),
            Ok(pb::AckMode::EachInPlace) => Ok(Some(Self::EachInPlace)),
            Err(_) => Err(Status::invalid_argument(format!(
                "unknown ack mode {value} in the first request (expected ACK_MODE_EACH, ACK_MODE_CUMULATIVE, ACK_MODE_NONE or ACK_MODE_EACH_IN_PLACE)"
            ))),
        }
    }

    /// The mode of the call's `eventbus-ack` metadata; `None` when there is none.
    fn from_metadata(metadata: &MetadataMap) -> Result<Option<Self>, Status> {
        let Some(value) = metadata.get(ACK_METADATA) else { return Ok(None) };
        let text = value.to_str().unwrap_or_default().trim();
        let mode = match text.to_ascii_lowercase().trim_start_matches("ack_mode_") {
            "each" => Self::Each,
            "cumulative" => Self::Cumulative,
            "none" => Self::None,
            "each_in_place" => Self::EachInPlace,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "{ACK_METADATA} metadata {:?} is not an ack mode (expected each, cumulative, none or each_in_place)",
                    String::from_utf8_lossy(value.as_bytes())
                )));
            }
        };
        Ok(Some(mode))
    }

    /// The stream's mode: the first request's, else the metadata's, else EACH; both
    /// given and different is an error.
    fn resolve(metadata: Option<Self>, first: Option<Self>) -> Result<Self, Status> {
        match (metadata, first) {
            (Some(m), Some(f)) if m != f => Err(Status::invalid_argument(format!(
                "the first request asks for ack mode {} but the {ACK_METADATA} metadata for {}",
                f.name(),
                m.name()
            ))),
            (m, f) => Ok(f.or(m).unwrap_or(Self::Each)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Each => "each",
            Self::Cumulative => "cumulative",
            Self::None => "none",
            Self::EachInPlace => "each_in_place",
        }
    }
}

/// Reads and decodes a `PublishStream`'s requests in a task of their own, a chunk (the
/// requests that arrived together) at a time, at most two chunks ahead of the publishing:
/// decoding overlaps publishing and answering, on another core when one is free. The
/// task ends with the request stream, or as soon as the answers are no longer wanted.
pub(crate) fn read_ahead<S>(inbound: S) -> ReadAhead
where
    S: Stream<Item = Result<pb::PublishRequest, Status>> + Send + 'static,
{
    let (tx, chunks) = tokio::sync::mpsc::channel(2);
    let mut inbound = Box::pin(inbound.ready_chunks(PUBLISH_CHUNK));
    let reader = tokio::spawn(async move {
        loop {
            let chunk = tokio::select! {
                () = tx.closed() => return,
                chunk = inbound.next() => chunk,
            };
            let Some(chunk) = chunk else { return };
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
    });
    ReadAhead { chunks, reader: Some(reader) }
}

/// The receiving end of [`read_ahead`].
pub(crate) struct ReadAhead {
    chunks: tokio::sync::mpsc::Receiver<Vec<Result<pb::PublishRequest, Status>>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl ReadAhead {
    /// The next chunk; `None` once the request stream has ended. A reader that died
    /// (it cannot, short of a bug) ends the stream with INTERNAL rather than as if the
    /// publisher had finished.
    pub(crate) async fn recv(&mut self) -> Option<Vec<Result<pb::PublishRequest, Status>>> {
        if let Some(chunk) = self.chunks.recv().await {
            return Some(chunk);
        }
        match self.reader.take()?.await {
            Ok(()) => None,
            Err(err) => {
                tracing::error!(error = %err, "a publish stream's reader failed");
                Some(vec![Err(Status::internal("the broker stopped reading this stream"))])
            }
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        if let Some(reader) = &self.reader {
            reader.abort();
        }
    }
}

/// Answers a refused event on its own, and counts it.
fn refuse(
    totals: &mut pb::PublishAck,
    metrics: Option<&Metrics>,
    answers: &mut Vec<Result<StreamAnswer, Status>>,
    position: u64,
    status: &Status,
) {
    totals.refused += 1;
    count_refused(metrics, status);
    answers.push(Ok(StreamAnswer::Refused { position, error: publish_error(status) }));
}

/// Whether a status from reading the requests refuses one (it does not decode, or is
/// over the read limit), rather than tells that the stream failed (the publisher went
/// away, the connection broke), which refuses no publish.
fn refuses_a_request(status: &Status) -> bool {
    matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted)
}

/// Records an accepted publish's duration.
fn observe(metrics: Option<&Metrics>, published: &Published) {
    if let Some(metrics) = metrics {
        metrics.observe_publish(published.duration);
    }
}

/// Counts a refused publish in the metrics.
pub(crate) fn count_refused(metrics: Option<&Metrics>, status: &Status) {
    if let Some(metrics) = metrics {
        metrics.count_refused(status.code());
    }
}

/// An open `PublishStream`, between chunks.
struct Publishing {
    inbound: ReadAhead,
    svc: EventBusService,
    peer: Arc<str>,
    /// The stream's trace context (its request metadata), kept on each event that has
    /// none of its own.
    trace: Option<TraceContext>,
    watch: CallerWatch,
    /// The metadata's mode until the first request is read, then the stream's.
    mode: Option<AckMode>,
    resolved: bool,
    /// Requests read so far: the position of the next one.
    position: u64,
    /// The running totals, but for `last_event_id`: see [`Publishing::totals`].
    totals: pb::PublishAck,
    /// The last accepted event's id, copied into the totals only when they are sent.
    last_id: Option<Arc<str>>,
    /// Whether EACH_IN_PLACE chunks may be published while earlier ones commit (see
    /// [`PIPELINE_DEPTH`]).
    pipelined: bool,
    /// Chunks being published, oldest first (pipelined only).
    in_flight: VecDeque<InFlight>,
    /// No chunk is to be read any more: the requests ended, or one did not decode.
    input_done: bool,
}

/// What one step of the stream yields, and whether it goes on.
type Step = (Vec<Result<StreamAnswer, Status>>, bool);

/// Chunks of an EACH_IN_PLACE stream being published at once on the embedded store:
/// the next chunk's captures join the writer's queue while an earlier chunk's commit
/// (and its fsync) is under way, as concurrent unary calls' do, so the many callers of
/// one client's `publish()` share commits. Answers keep the stream's order.
const PIPELINE_DEPTH: usize = 4;

/// What the bus answers for a chunk's accepted events.
type Publishes = Pin<Box<dyn Future<Output = Vec<Result<Published, eventbus_core::Error>>> + Send>>;

/// A lenient chunk read and checked: its refusals at the edge and the positions of the
/// events handed to the bus, both in stream order.
struct Checked {
    positions: Vec<u64>,
    refused_here: Vec<(u64, Status)>,
    /// A request that did not decode: the stream ends after this chunk's answers.
    broken: Option<Status>,
}

/// A chunk being published (pipelined).
struct InFlight {
    checked: Checked,
    published: Publishes,
}

/// What a pipelined stream waited for.
enum Woke {
    Published(Vec<Result<Published, eventbus_core::Error>>),
    Chunk(Option<Vec<Result<pb::PublishRequest, Status>>>),
    ShuttingDown,
}

/// A request of a stream as the bus takes it, with the stream's trace context.
fn stream_input(
    req: pb::PublishRequest,
    peer: &Arc<str>,
    trace: Option<&TraceContext>,
    caller: &crate::access::Caller,
) -> eventbus_core::PublishInput {
    let mut input = convert::publish_input(req, Arc::clone(peer), caller.name());
    if let Some(trace) = trace {
        trace.keep_in(&mut input.metadata);
    }
    input
}

impl Publishing {
    fn mode(&self) -> AckMode {
        self.mode.unwrap_or(AckMode::Each)
    }

    /// The totals as they are sent.
    fn totals(&self) -> StreamAnswer {
        let last_event_id = self.last_id.as_deref().unwrap_or_default().to_owned();
        StreamAnswer::Totals(pb::PublishAck { last_event_id, ..self.totals.clone() })
    }

    /// The answers to the next chunk; `None` once the stream is over.
    async fn step(&mut self) -> Option<Step> {
        if self.resolved && self.pipelined && self.mode() == AckMode::EachInPlace {
            return self.step_pipelined().await;
        }
        let next = tokio::select! {
            biased;
            chunk = self.inbound.recv() => chunk,
            // Between chunks, nothing read is left unanswered: the stream ends now, and
            // its publisher opens the next one on a broker that is up.
            () = self.svc.ops.bus().shutdown_begun() => {
                let refused = status(eventbus_core::Error::ShuttingDown);
                return Some(match self.mode() {
                    AckMode::Each | AckMode::EachInPlace => (vec![Err(refused)], false),
                    AckMode::Cumulative | AckMode::None => (vec![Ok(self.totals()), Err(refused)], false),
                });
            }
        };
        let Some(chunk) = next else {
            // The publisher closed its side and everything was read.
            return match self.mode() {
                AckMode::Each | AckMode::EachInPlace => None,
                AckMode::Cumulative | AckMode::None => {
                    self.totals.end = true;
                    Some((vec![Ok(self.totals())], false))
                }
            };
        };
        if !self.resolved {
            self.resolved = true;
            let first = match chunk.first() {
                Some(Ok(req)) => AckMode::from_request(req.ack),
                _ => Ok(None),
            };
            match first.and_then(|first| AckMode::resolve(self.mode, first)) {
                Ok(mode) => self.mode = Some(mode),
                Err(refused) => return Some((vec![Err(refused)], false)),
            }
        }
        Some(match self.mode() {
            AckMode::Each => self.each(chunk).await,
            AckMode::EachInPlace if self.pipelined => {
                self.start(chunk).await;
                return self.step_pipelined().await;
            }
            AckMode::Cumulative | AckMode::None | AckMode::EachInPlace => self.lenient(chunk).await,
        })
    }

    /// EACH_IN_PLACE, pipelined: the answers to the oldest chunk in flight once it is
    /// published, reading and starting more chunks meanwhile; `None` once the stream
    /// is over.
    async fn step_pipelined(&mut self) -> Option<Step> {
        loop {
            if self.input_done && self.in_flight.is_empty() {
                return None;
            }
            let Self { in_flight, inbound, svc, input_done, .. } = &mut *self;
            let busy = !in_flight.is_empty();
            let can_read = !*input_done && in_flight.len() < PIPELINE_DEPTH;
            let oldest = async {
                match in_flight.front_mut() {
                    Some(chunk) => chunk.published.as_mut().await,
                    None => std::future::pending().await,
                }
            };
            let woke = tokio::select! {
                biased;
                published = oldest, if busy => Woke::Published(published),
                chunk = inbound.recv(), if can_read => Woke::Chunk(chunk),
                // Between chunks, nothing read is left unanswered: the stream ends now.
                () = svc.ops.bus().shutdown_begun(), if !busy => Woke::ShuttingDown,
            };
            match woke {
                Woke::Published(published) => {
                    let Some(InFlight { checked, .. }) = self.in_flight.pop_front() else { continue };
                    return Some(self.answer_lenient(checked, published));
                }
                Woke::Chunk(None) => self.input_done = true,
                Woke::Chunk(Some(chunk)) => self.start(chunk).await,
                Woke::ShuttingDown => return Some((vec![Err(status(eventbus_core::Error::ShuttingDown))], false)),
            }
        }
    }

    /// Checks a chunk and hands its accepted events to the bus (pipelined).
    async fn start(&mut self, chunk: Vec<Result<pb::PublishRequest, Status>>) {
        let (checked, mut inputs) = self.check_lenient(chunk);
        if checked.broken.is_some() {
            self.input_done = true;
        }
        let bus = self.svc.ops.bus().clone();
        let spans = self.svc.ops.spans().publish_all(&mut inputs);
        let mut published: Publishes = if inputs.is_empty() {
            Box::pin(std::future::ready(Vec::new()))
        } else {
            Box::pin(async move {
                let published = bus.publish_each(inputs).await;
                spans.end_all(&published);
                published
            })
        };
        // Polled once now: the embedded store queues a chunk's captures on the first
        // poll, so a later chunk's captures queue after these (the order per key holds).
        if let Poll::Ready(done) = futures::poll!(published.as_mut()) {
            published = Box::pin(std::future::ready(done));
        }
        self.in_flight.push_back(InFlight { checked, published });
    }

    /// EACH: every event answered in order; a refused request, or one tonic could not
    /// read, is answered with its status and nothing after it is published.
    async fn each(&mut self, chunk: Vec<Result<pb::PublishRequest, Status>>) -> Step {
        let svc = &self.svc;
        let caller = self.watch.current();
        let mut inputs = Vec::with_capacity(chunk.len());
        // The status that ends the stream after the publishes before it, and whether it
        // refuses a publish (rather than the stream failing under it).
        let mut broken = None;
        for req in chunk {
            match req {
                Ok(req) => {
                    if let Err(refused) = svc.ops.check_stream_publish(caller, &req.channel) {
                        broken = Some((refused.into(), true));
                        break;
                    }
                    inputs.push(stream_input(req, &self.peer, self.trace.as_ref(), caller));
                }
                Err(status) => {
                    let status = svc.limit.translate(status);
                    let refusal = refuses_a_request(&status);
                    broken = Some((status, refusal));
                    break;
                }
            }
        }
        let mut answers = Vec::with_capacity(inputs.len() + 1);
        let metrics = svc.ops.metrics();
        let spans = svc.ops.spans().publish_all(&mut inputs);
        let published = svc.ops.bus().publish_many(inputs).await;
        spans.end_all(&published);
        for published in published {
            answers.push(match published {
                Ok(p) => {
                    observe(metrics, &p);
                    Ok(StreamAnswer::Published(p))
                }
                Err(err) => {
                    let refused = status(err);
                    count_refused(metrics, &refused);
                    Err(refused)
                }
            });
        }
        let failed = answers.last().is_some_and(Result::is_err);
        if let Some((status, refusal)) = broken.filter(|_| !failed) {
            if refusal {
                count_refused(metrics, &status);
            }
            answers.push(Err(status));
        }
        let more = !answers.last().is_some_and(Result::is_err);
        (answers, more)
    }

    /// CUMULATIVE, NONE and EACH_IN_PLACE: refused events answered on their own, with
    /// their position, the others published all the same (and answered, EACH_IN_PLACE);
    /// then the totals (CUMULATIVE). A request that does not decode, or the broker
    /// shutting down, ends the stream (after the totals, but in EACH_IN_PLACE).
    async fn lenient(&mut self, chunk: Vec<Result<pb::PublishRequest, Status>>) -> Step {
        if self.svc.ops.bus().is_shutting_down() {
            let refused = status(eventbus_core::Error::ShuttingDown);
            count_refused(self.svc.ops.metrics(), &refused);
            let mut answers = Vec::with_capacity(2);
            if self.mode() != AckMode::EachInPlace {
                answers.push(Ok(self.totals()));
            }
            answers.push(Err(refused));
            return (answers, false);
        }
        let (checked, mut inputs) = self.check_lenient(chunk);
        let bus = self.svc.ops.bus().clone();
        let spans = self.svc.ops.spans().publish_all(&mut inputs);
        let published = if inputs.is_empty() { Vec::new() } else { bus.publish_each(inputs).await };
        spans.end_all(&published);
        self.answer_lenient(checked, published)
    }

    /// A lenient chunk's checks at the edge, and the events to hand to the bus.
    fn check_lenient(
        &mut self,
        chunk: Vec<Result<pb::PublishRequest, Status>>,
    ) -> (Checked, Vec<eventbus_core::PublishInput>) {
        let svc = &self.svc;
        let caller = self.watch.current();
        let mut inputs = Vec::with_capacity(chunk.len());
        let mut positions = Vec::with_capacity(chunk.len());
        let mut refused_here: Vec<(u64, Status)> = Vec::new();
        let mut broken = None;
        for req in chunk {
            let position = self.position;
            self.position += 1;
            match req {
                Ok(req) => match svc.ops.check_stream_publish(caller, &req.channel) {
                    Ok(()) => {
                        inputs.push(stream_input(req, &self.peer, self.trace.as_ref(), caller));
                        positions.push(position);
                    }
                    Err(refused) => refused_here.push((position, refused.into())),
                },
                Err(status) => {
                    broken = Some(svc.limit.translate(status));
                    break;
                }
            }
        }
        (Checked { positions, refused_here, broken }, inputs)
    }

    /// A lenient chunk's answers, once the bus answered for its accepted events.
    fn answer_lenient(&mut self, checked: Checked, published: Vec<Result<Published, eventbus_core::Error>>) -> Step {
        let Checked { positions, refused_here, broken } = checked;
        let in_place = self.mode() == AckMode::EachInPlace;
        let mut answers = Vec::with_capacity(if in_place { positions.len() + refused_here.len() + 1 } else { 1 });
        let metrics = self.svc.ops.metrics();
        let mut edge = refused_here.into_iter().peekable();
        let totals = &mut self.totals;
        let mut stopping = false;
        for (position, published) in positions.into_iter().zip(published) {
            while let Some((at, status)) = edge.next_if(|(at, _)| *at < position) {
                refuse(totals, metrics, &mut answers, at, &status);
            }
            match published {
                Ok(p) => {
                    observe(metrics, &p);
                    totals.count += 1;
                    totals.delivered += u64::from(p.delivered);
                    totals.failed += u64::from(p.failed);
                    totals.captured += u64::from(p.captured);
                    totals.duplicates += u64::from(p.duplicate);
                    if in_place {
                        self.last_id = Some(p.event_id.clone());
                        answers.push(Ok(StreamAnswer::Published(p)));
                    } else {
                        self.last_id = Some(p.event_id);
                    }
                }
                // The broker began to stop while the chunk was published, and published
                // none of the rest: the stream ends here, as between chunks, and its
                // publisher sends what is unanswered again to a broker that is up (a
                // refusal in place would be an answer, and an event with an idempotency
                // key would not be sent again).
                Err(eventbus_core::Error::ShuttingDown) => {
                    stopping = true;
                    break;
                }
                Err(err) => refuse(totals, metrics, &mut answers, position, &status(err)),
            }
        }
        if stopping {
            let refused = status(eventbus_core::Error::ShuttingDown);
            count_refused(metrics, &refused);
            if !in_place {
                answers.push(Ok(self.totals()));
            }
            answers.push(Err(refused));
            return (answers, false);
        }
        for (at, status) in edge {
            refuse(totals, metrics, &mut answers, at, &status);
        }
        let report = self.mode == Some(AckMode::Cumulative) || (broken.is_some() && !in_place);
        if report {
            answers.push(Ok(self.totals()));
        }
        match broken {
            Some(status) => {
                if refuses_a_request(&status) {
                    count_refused(metrics, &status);
                }
                answers.push(Err(status));
                (answers, false)
            }
            None => (answers, true),
        }
    }
}

impl EventBusService {
    /// Publishes a `PublishStream`'s requests and answers them as the publisher chose.
    /// The requests that arrived together are published together (one durable capture
    /// round trip for all of them).
    pub(crate) fn answer_publishes(&self, req: Request<Streaming<pb::PublishRequest>>) -> Result<Answers, Status> {
        let peer = peer(&req);
        let caller = caller(&req)?;
        let mode = AckMode::from_metadata(req.metadata())?;
        let trace = TraceContext::from_grpc(req.metadata());
        // Registered like the other streams: a reload that removes the principal, or
        // its credential's expiry, ends it UNAUTHENTICATED, and each chunk is checked
        // against the principal's rights of the moment.
        let guard = self.ops.open_publisher(&caller)?;
        let watch = guard.watch(caller);
        let publishing = Publishing {
            inbound: read_ahead(req.into_inner()),
            svc: self.clone(),
            peer: peer.into(),
            trace,
            watch,
            mode,
            resolved: false,
            position: 0,
            totals: pb::PublishAck::default(),
            last_id: None,
            // Only the embedded store queues a chunk's captures on the first poll, which
            // keeps the order per key across chunks in flight.
            pipelined: self.ops.bus().mode() == "in_memory" && self.ops.bus().durable().is_some(),
            in_flight: VecDeque::new(),
            input_done: false,
        };
        let answers = stream::unfold(Some(publishing), |state| async move {
            let mut publishing = state?;
            let (answers, more) = publishing.step().await?;
            Some((stream::iter(answers), more.then_some(publishing)))
        })
        .flatten();
        Ok(Box::pin(guard.guard(answers)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    fn request(n: usize) -> Result<pb::PublishRequest, Status> {
        Ok(pb::PublishRequest { channel: format!("c.{n}"), ..Default::default() })
    }

    /// Sets its flag when dropped: the reader let go of the request stream.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    async fn within<T>(fut: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), fut).await.expect("timed out")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reader_keeps_the_order_and_ends_with_the_requests() {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut chunks = read_ahead(tokio_stream::wrappers::ReceiverStream::new(rx));
        let sender = tokio::spawn(async move {
            for n in 0..2_000 {
                tx.send(request(n)).await.unwrap();
            }
        });
        let mut seen = Vec::new();
        while let Some(chunk) = within(chunks.recv()).await {
            assert!(!chunk.is_empty() && chunk.len() <= PUBLISH_CHUNK);
            seen.extend(chunk.into_iter().map(|r| r.unwrap().channel));
        }
        within(sender).await.unwrap();
        assert_eq!(seen, (0..2_000).map(|n| format!("c.{n}")).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_whose_answers_are_not_wanted_lets_go_of_the_requests() {
        let released = Arc::new(AtomicBool::new(false));
        let guard = Dropped(Arc::clone(&released));
        // A request stream that never ends: one request, then nothing, ever.
        let inbound = stream::once(async { request(0) }).chain(stream::pending()).map(move |r| {
            let _held = &guard;
            r
        });
        let mut chunks = read_ahead(inbound);
        assert_eq!(within(chunks.recv()).await.map(|c| c.len()), Some(1));
        assert!(!released.load(Ordering::SeqCst), "still reading");
        drop(chunks);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !released.load(Ordering::SeqCst) {
            assert!(tokio::time::Instant::now() < deadline, "the reader still holds the request stream");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn the_mode_comes_from_the_first_request_or_the_metadata() {
        let mut metadata = MetadataMap::new();
        assert_eq!(AckMode::from_metadata(&metadata).ok(), Some(None));
        for (text, mode) in
            [("none", AckMode::None), ("Cumulative", AckMode::Cumulative), ("ACK_MODE_EACH", AckMode::Each)]
        {
            metadata.insert(ACK_METADATA, text.parse().unwrap());
            assert_eq!(AckMode::from_metadata(&metadata).ok(), Some(Some(mode)), "{text}");
        }
        metadata.insert(ACK_METADATA, "some".parse().unwrap());
        let refused = AckMode::from_metadata(&metadata).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().contains("\"some\""), "{}", refused.message());

        assert_eq!(AckMode::from_request(0).ok(), Some(None));
        assert_eq!(AckMode::from_request(pb::AckMode::None as i32).ok(), Some(Some(AckMode::None)));
        assert_eq!(AckMode::from_request(9).unwrap_err().code(), tonic::Code::InvalidArgument);

        assert_eq!(AckMode::resolve(None, None).ok(), Some(AckMode::Each));
        assert_eq!(AckMode::resolve(Some(AckMode::None), None).ok(), Some(AckMode::None));
        assert_eq!(AckMode::resolve(None, Some(AckMode::Cumulative)).ok(), Some(AckMode::Cumulative));
        assert_eq!(AckMode::resolve(Some(AckMode::None), Some(AckMode::None)).ok(), Some(AckMode::None));
        let conflict = AckMode::resolve(Some(AckMode::None), Some(AckMode::Each)).unwrap_err();
        assert!(conflict.message().contains("each") && conflict.message().contains("none"), "{}", conflict.message());
    }
}
