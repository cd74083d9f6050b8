//! [`Client::publish`](crate::Client::publish) over one long-lived `PublishStream` per
//! client (each-answer mode): the calls of every task share it, so a service that
//! publishes one event per request handler pays a stream message per event instead of
//! a whole HTTP/2 call.
//!
//! One task owns the stream. Calls queue to it; it sends whatever has queued as soon
//! as it can (the calls that arrive while it is busy go out together, one write), and
//! matches the broker's answers, which come in order, to the calls in the order they
//! were sent. The stream answers each event, a refused one in place
//! (`ACK_MODE_EACH_IN_PLACE`), so each call gets its own answer or its own error:
//! - a refused event fails its own call, and the stream goes on;
//! - a stream ended by a request the broker could not read (over its read limit) fails
//!   that call; the broker read nothing after it, so the calls sent after it go again,
//!   first and in order, on a new stream;
//! - a stream lost otherwise (connection broken, broker restarting) leaves the fate of
//!   the unanswered events unknown: a call with an idempotency key is sent again (the
//!   broker answers a duplicate with the original id), any other fails with
//!   [`Error::Unavailable`]: never an OK for an event whose answer was not seen;
//! - a caller that stops waiting (its future dropped, e.g. by `tokio::time::timeout`)
//!   before its event was sent takes it back: it is never sent.

use std::collections::VecDeque;
use std::time::Duration;

use eventbus_proto::pb;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::Error;
use crate::codec::{self, Method};
use crate::options::AuthChannel;
use crate::publish;

/// Calls waiting for the stream's task before `publish` itself waits.
const QUEUE: usize = 4096;
/// Most events sent and not yet answered; past it calls wait in the queue.
const MAX_IN_FLIGHT: usize = 4096;
/// Most calls taken from the queue at once.
const CHUNK: usize = 256;
/// Times an event with an idempotency key is sent again after streams lost under it.
const MAX_RESENDS: u8 = 3;
/// First and longest pause between attempts to open a stream again.
const REOPEN_FIRST: Duration = Duration::from_millis(20);
const REOPEN_MAX: Duration = Duration::from_millis(500);

/// How the shared stream gathers calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// How long a chunk waits for more calls while earlier ones are unanswered; zero
    /// sends at once.
    pub(crate) linger: Duration,
    /// How long calls wait for a stream that cannot be opened (the broker away) before
    /// failing with its error.
    pub(crate) reopen_for: Duration,
}

/// The calls' side: a handle on the stream's task, which ends when the last handle
/// (the last clone of the client) is dropped.
#[derive(Debug)]
pub(crate) struct SharedPublisher {
    calls: mpsc::Sender<Call>,
}

/// One `publish` call, waiting for its answer.
#[derive(Debug)]
struct Call {
    request: pb::PublishRequest,
    answer: oneshot::Sender<Result<pb::PublishResponse, Error>>,
    /// Streams lost under this call while it was sent and unanswered.
    lost: u8,
}

impl Call {
    fn answer(self, answer: Result<pb::PublishResponse, Error>) {
        // The caller may have stopped waiting: nobody to tell.
        let _ = self.answer.send(answer);
    }

    fn abandoned(&self) -> bool {
        self.answer.is_closed()
    }
}

impl SharedPublisher {
    /// Starts the stream's task (the stream itself opens with the first call).
    pub(crate) fn start(channel: AuthChannel, tuning: Tuning) -> Self {
        let (calls, queue) = mpsc::channel(QUEUE);
        let task = Task { channel, queue, waiting: VecDeque::new(), gathered: Vec::new(), linger_until: None, tuning };
        tokio::spawn(task.run());
        Self { calls }
    }

    /// Publishes one event on the shared stream and waits for its own answer.
    pub(crate) async fn publish(&self, request: pb::PublishRequest) -> Result<pb::PublishResponse, Error> {
        let (answer, answered) = oneshot::channel();
        self.calls.send(Call { request, answer, lost: 0 }).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

/// The task ended: its runtime is shutting down.
fn stopped() -> Error {
    Error::Unavailable(tonic::Status::unavailable("the client's publish stream stopped (its runtime is shutting down)"))
}

/// The stream's task.
struct Task {
    channel: AuthChannel,
    queue: mpsc::Receiver<Call>,
    /// Calls taken from the queue and not sent yet, in order: those to send again come
    /// first.
    waiting: VecDeque<Call>,
    /// Calls taken from the queue by a [`Task::take`] that may not have finished
    /// (`select!` drops it when an answer comes first): kept here, never lost.
    gathered: Vec<Call>,
    /// Until when the chunk being gathered waits for more calls.
    linger_until: Option<Instant>,
    tuning: Tuning,
}

/// An open stream.
struct Open {
    requests: mpsc::Sender<pb::PublishRequest>,
    answers: tonic::Streaming<pb::PublishResponse>,
    /// Sent and unanswered, in the order sent: the broker answers in this order.
    in_flight: VecDeque<Call>,
}

impl Task {
    async fn run(mut self) {
        let mut stream: Option<Open> = None;
        loop {
            self.waiting.retain(|call| !call.abandoned());
            let Some(open) = stream.as_mut() else {
                if self.waiting.is_empty() {
                    match self.queue.recv().await {
                        Some(call) => self.waiting.push_back(call),
                        // Every handle is gone: no caller is left.
                        None => return,
                    }
                    continue;
                }
                stream = self.open().await;
                continue;
            };
            send(open, &mut self.waiting);
            let room = open.in_flight.len() < MAX_IN_FLIGHT;
            let idle = open.in_flight.is_empty();
            // The answers are read even with nothing in flight: a stream that ends while
            // idle is dropped then, not found dead by the next call.
            tokio::select! {
                biased;
                answer = open.answers.message() => match answer {
                    Ok(Some(mut response)) => match open.in_flight.pop_front() {
                        Some(call) => call.answer(match response.error.take() {
                            None => Ok(response),
                            Some(error) => Err(publish::refusal(error)),
                        }),
                        None => {
                            let status = tonic::Status::internal("the broker answered more events than were sent");
                            self.lost(stream.take(), status);
                        }
                    },
                    Ok(None) => {
                        let status = tonic::Status::unavailable("the broker ended the publish stream");
                        self.lost(stream.take(), status);
                    }
                    Err(status) => self.lost(stream.take(), status),
                },
                taken = self.take(!idle), if room => {
                    if taken == 0 {
                        // Every handle is gone; answer what is in flight, then stop.
                        if idle {
                            return;
                        }
                        self.finish(stream.take()).await;
                        return;
                    }
                }
            }
        }
    }

    /// Takes the calls that have queued (at least one, waiting for it); with a linger
    /// and a busy stream, waits that long for more. 0 once every handle is gone.
    /// Cancel-safe: what it took stays in `gathered`.
    async fn take(&mut self, busy: bool) -> usize {
        if self.gathered.is_empty() {
            if self.queue.recv_many(&mut self.gathered, CHUNK).await == 0 {
                return 0;
            }
            if busy && !self.tuning.linger.is_zero() {
                self.linger_until = Some(Instant::now() + self.tuning.linger);
            }
        }
        if let Some(until) = self.linger_until {
            while self.gathered.len() < CHUNK {
                let more = CHUNK - self.gathered.len();
                match tokio::time::timeout_at(until, self.queue.recv_many(&mut self.gathered, more)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            self.linger_until = None;
        }
        let n = self.gathered.len();
        self.waiting.extend(self.gathered.drain(..));
        n
    }

    /// Opens a stream for the waiting calls, trying again with backoff while the
    /// broker is away, up to `reopen_for`; then fails them with the last error.
    async fn open(&mut self) -> Option<Open> {
        let give_up = Instant::now() + self.tuning.reopen_for;
        let mut pause = REOPEN_FIRST;
        loop {
            let error = match tokio::time::timeout_at(give_up, open(self.channel.clone())).await {
                Ok(Ok(open)) => return Some(open),
                Ok(Err(error)) => error,
                Err(_) => Error::Unavailable(tonic::Status::unavailable(format!(
                    "the broker did not open a publish stream within {:?}",
                    self.tuning.reopen_for
                ))),
            };
            // The calls queued meanwhile share the wait.
            while let Ok(call) = self.queue.try_recv() {
                self.waiting.push_back(call);
            }
            self.waiting.retain(|call| !call.abandoned());
            if self.waiting.is_empty() {
                return None;
            }
            if Instant::now() + pause >= give_up {
                tracing::debug!(%error, "cannot open a publish stream");
                for call in self.waiting.drain(..) {
                    call.answer(Err(copy(&error)));
                }
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(REOPEN_MAX);
        }
    }

    /// The stream ended under calls in flight, with `status`.
    fn lost(&mut self, stream: Option<Open>, status: tonic::Status) {
        let Some(mut open) = stream else { return };
        let mut again = VecDeque::with_capacity(open.in_flight.len());
        if refuses_one(&status) {
            // The broker could not read the first unanswered event, and read no further.
            if let Some(refused) = open.in_flight.pop_front() {
                refused.answer(Err(Error::from(status)));
            }
            again.extend(open.in_flight.drain(..));
        } else {
            tracing::debug!(%status, in_flight = open.in_flight.len(), "publish stream lost");
            for mut call in open.in_flight.drain(..) {
                if !call.request.idempotency_key.is_empty() && call.lost < MAX_RESENDS {
                    call.lost += 1;
                    again.push_back(call);
                } else {
                    call.answer(Err(unanswered(&status)));
                }
            }
        }
        // Before the calls that were not sent yet, in the order they were sent.
        again.append(&mut self.waiting);
        self.waiting = again;
    }

    /// Every handle is gone: the calls in flight get their answers, then the stream
    /// closes.
    async fn finish(&mut self, stream: Option<Open>) {
        let Some(mut open) = stream else { return };
        drop(open.requests);
        while let Some(call) = open.in_flight.pop_front() {
            match open.answers.message().await {
                Ok(Some(response)) => call.answer(Ok(response)),
                Ok(None) => call.answer(Err(unanswered(&tonic::Status::unavailable("the stream ended")))),
                Err(status) => call.answer(Err(unanswered(&status))),
            }
        }
    }
}

/// Sends the waiting calls the stream has room for; a caller that stopped waiting
/// takes its event back.
fn send(open: &mut Open, waiting: &mut VecDeque<Call>) {
    while open.in_flight.len() < MAX_IN_FLIGHT {
        let Some(call) = waiting.pop_front() else { return };
        if call.abandoned() {
            continue;
        }
        match open.requests.try_send(call.request.clone()) {
            Ok(()) => open.in_flight.push_back(call),
            Err(_) => {
                // The stream is closing: its answers will say why, and this call goes
                // again with the others.
                waiting.push_front(call);
                return;
            }
        }
    }
}

async fn open(channel: AuthChannel) -> Result<Open, Error> {
    let (requests, outgoing) = mpsc::channel(MAX_IN_FLIGHT);
    let mut request = tonic::Request::new(ReceiverStream::new(outgoing));
    request.metadata_mut().insert(publish::ACK_METADATA, tonic::metadata::MetadataValue::from_static("each_in_place"));
    let answers = codec::streaming(channel, Method::PublishStream, request).await?;
    Ok(Open { requests, answers, in_flight: VecDeque::new() })
}

/// Whether a status ending the stream is the broker refusing the first unanswered
/// request (one it could not read: nothing after it published), rather than the stream
/// failing. The codes the broker answers a bad request with, never produced by the
/// connection breaking.
fn refuses_one(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::InvalidArgument
            | Code::PermissionDenied
            | Code::ResourceExhausted
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::AlreadyExists
    )
}

/// The error of a call whose event was sent on a stream lost before its answer.
fn unanswered(status: &tonic::Status) -> Error {
    if status.code() == tonic::Code::Unauthenticated {
        return Error::from(tonic::Status::unauthenticated(status.message().to_owned()));
    }
    Error::Unavailable(tonic::Status::unavailable(format!(
        "the publish stream was lost before the broker answered this event ({}: {}); it may or may not be published: publish it again (with an idempotency key, to publish it once)",
        status.code(),
        status.message()
    )))
}

/// The same error again, for each waiting call.
fn copy(error: &Error) -> Error {
    match error.status() {
        Some(status) => Error::from(tonic::Status::new(status.code(), status.message().to_owned())),
        None => match error {
            Error::Connect { server, reason } => Error::Connect { server: server.clone(), reason: reason.clone() },
            other => Error::Unavailable(tonic::Status::unavailable(other.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_tells_that_the_events_after_it_were_not_published() {
        assert!(refuses_one(&tonic::Status::invalid_argument("bad channel")));
        assert!(refuses_one(&tonic::Status::permission_denied("no right")));
        for lost in [
            tonic::Status::unavailable("broker shutting down"),
            tonic::Status::unknown("h2 protocol error"),
            tonic::Status::internal("connection reset"),
            tonic::Status::cancelled("gone"),
            tonic::Status::unauthenticated("token removed"),
        ] {
            assert!(!refuses_one(&lost), "{lost:?}");
        }
        let err = unanswered(&tonic::Status::unknown("connection reset"));
        assert!(matches!(&err, Error::Unavailable(_)) && err.is_transient(), "{err}");
        assert!(err.to_string().contains("may or may not be published"), "{err}");
        assert!(matches!(unanswered(&tonic::Status::unauthenticated("gone")), Error::Unauthenticated(_)));
    }
}
