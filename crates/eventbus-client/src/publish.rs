//! Pipelined publishing over one `PublishStream` (a sender half and an answers half), and
//! the per-event answers of a `PublishBatch`.

use eventbus_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::Error;
use crate::codec::{self, Method};
use crate::options::AuthChannel;

/// The sending half of a `PublishStream`. Cheap to clone; the stream's request side
/// closes when every clone is dropped (or [`close`](Self::close)d), after which the
/// broker answers what it has and ends the answers.
#[derive(Debug, Clone)]
pub struct PublishSender {
    tx: mpsc::Sender<pb::PublishRequest>,
}

impl PublishSender {
    /// Queues one publish; waits only when the window is full. Fails with
    /// [`Error::Unavailable`] once the stream has ended (the reason is on the answers).
    /// The event is a [`Message`](crate::Message) or a raw [`pb::PublishRequest`]; it
    /// carries the caller's current trace context (W3C, in its metadata) unless it has
    /// one of its own.
    pub async fn send(&self, request: impl Into<pb::PublishRequest>) -> Result<(), Error> {
        let mut request = request.into();
        crate::trace::carry_current(&mut request.metadata);
        self.tx.send(request).await.map_err(|_| Error::from(tonic::Status::unavailable("the publish stream ended")))
    }

    /// Drops this sender: with no clone left, the request side of the stream closes.
    pub fn close(self) {}
}

/// The answering half of a `PublishStream`, in the stream's [`AckMode`]: with `Each`,
/// one answer per publish, in order; with `Cumulative`, running totals per chunk the
/// broker read; with `None`, nothing for an accepted publish. In the last two, refused
/// publishes are answered on their own, and the stream ends with its totals.
#[derive(Debug)]
pub struct PublishAnswers {
    responses: tonic::Streaming<pb::PublishResponse>,
}

/// One answer read from a `PublishStream` ([`PublishAnswers::next_answer`]).
#[derive(Debug)]
pub enum PublishAnswer {
    /// `Each`: the answer to the next publish, in order.
    Published(pb::PublishResponse),
    /// `Cumulative` and `None`: the publish at `position` (from 0, in the order sent)
    /// was refused; the ones after it are published all the same.
    Refused { position: u64, error: Error },
    /// `Cumulative` and `None`: the stream's running totals, covering every publish
    /// before it; the last one has `end` set.
    Totals(pb::PublishAck),
}

impl PublishAnswers {
    /// The next raw response; `None` once the stream has ended. With `Each`, an invalid
    /// publish ends the stream with its error (earlier ones stay published).
    pub async fn next(&mut self) -> Result<Option<pb::PublishResponse>, Error> {
        Ok(self.responses.message().await?)
    }

    /// The next answer, by kind; `None` once the stream has ended.
    pub async fn next_answer(&mut self) -> Result<Option<PublishAnswer>, Error> {
        Ok(self.next().await?.map(answer))
    }
}

/// A response by kind.
fn answer(mut response: pb::PublishResponse) -> PublishAnswer {
    if let Some(totals) = response.ack.take() {
        return PublishAnswer::Totals(totals);
    }
    match response.error.take() {
        Some(error) => PublishAnswer::Refused { position: response.position, error: refusal(error) },
        None => PublishAnswer::Published(response),
    }
}

/// A refused event's error, typed like the call's status would be.
pub(crate) fn refusal(error: pb::PublishError) -> Error {
    tonic::Status::new(tonic::Code::from_i32(error.code), error.message).into()
}

/// The call metadata that chooses the ack mode.
pub(crate) const ACK_METADATA: &str = "eventbus-ack";

pub(crate) async fn open(
    channel: AuthChannel,
    window: usize,
    ack: AckMode,
) -> Result<(PublishSender, PublishAnswers), Error> {
    let (tx, rx) = mpsc::channel(window.max(1));
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(mode) = ack.metadata() {
        request.metadata_mut().insert(ACK_METADATA, tonic::metadata::MetadataValue::from_static(mode));
    }
    let responses = codec::streaming(channel, Method::PublishStream, request).await?;
    Ok((PublishSender { tx }, PublishAnswers { responses }))
}

/// What a `PublishStream`'s publisher waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AckMode {
    /// One answer per publish, in order (the default). A refused publish ends the stream.
    #[default]
    Each,
    /// Running totals ([`pb::PublishAck`]) per chunk of publishes the broker read
    /// together; refused publishes answered on their own.
    Cumulative,
    /// Fire and forget: only refused publishes are answered, then the totals at the end.
    None,
}

impl AckMode {
    /// The `eventbus-ack` value; `None` for the default.
    fn metadata(self) -> Option<&'static str> {
        match self {
            Self::Each => None,
            Self::Cumulative => Some("cumulative"),
            Self::None => Some("none"),
        }
    }
}

impl std::str::FromStr for AckMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "each" => Ok(Self::Each),
            "cumulative" => Ok(Self::Cumulative),
            "none" => Ok(Self::None),
            _ => Err(format!("{s:?} is not an ack mode (expected each, cumulative or none)")),
        }
    }
}

/// The answers of a `PublishBatch` of `sent` events: each event's response, or its
/// refusal as an [`Error`].
pub(crate) fn batch_results(
    sent: usize,
    response: pb::PublishBatchResponse,
) -> Result<Vec<Result<pb::PublishResponse, Error>>, Error> {
    if response.results.len() != sent {
        let answered = response.results.len();
        return Err(Error::Protocol(format!("PublishBatch of {sent} events answered with {answered} results")));
    }
    Ok(response.results.into_iter().map(batch_result).collect())
}

fn batch_result(mut response: pb::PublishResponse) -> Result<pb::PublishResponse, Error> {
    match response.error.take() {
        None => Ok(response),
        Some(error) => Err(refusal(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_answers_keep_their_order_and_refusals_become_errors() {
        let ok = pb::PublishResponse { event_id: "e1".into(), delivered_count: 2, ..Default::default() };
        let refused = pb::PublishResponse {
            error: Some(pb::PublishError { code: tonic::Code::InvalidArgument as i32, message: "bad channel".into() }),
            ..Default::default()
        };
        let answers = batch_results(2, pb::PublishBatchResponse { results: vec![ok, refused] }).unwrap_or_default();
        assert!(
            matches!(&answers[..], [Ok(p), Err(Error::InvalidArgument(s))] if p.event_id == "e1" && s.message() == "bad channel")
        );
        let short = batch_results(3, pb::PublishBatchResponse { results: vec![] });
        assert!(matches!(short, Err(Error::Protocol(_))));
    }

    #[test]
    fn stream_answers_are_told_apart() {
        let published = pb::PublishResponse { event_id: "e1".into(), ..Default::default() };
        assert!(matches!(answer(published), PublishAnswer::Published(p) if p.event_id == "e1"));
        let refused = pb::PublishResponse {
            error: Some(pb::PublishError { code: tonic::Code::PermissionDenied as i32, message: "no".into() }),
            position: 7,
            ..Default::default()
        };
        assert!(matches!(answer(refused), PublishAnswer::Refused { position: 7, error: Error::PermissionDenied(_) }));
        let totals = pb::PublishResponse {
            ack: Some(pb::PublishAck { count: 3, end: true, ..Default::default() }),
            ..Default::default()
        };
        assert!(matches!(answer(totals), PublishAnswer::Totals(t) if t.count == 3 && t.end));
        assert_eq!("NONE".parse::<AckMode>(), Ok(AckMode::None));
        assert!("some".parse::<AckMode>().is_err());
    }
}
