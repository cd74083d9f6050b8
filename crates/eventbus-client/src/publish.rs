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
    pub async fn send(&self, request: pb::PublishRequest) -> Result<(), Error> {
        self.tx.send(request).await.map_err(|_| Error::from(tonic::Status::unavailable("the publish stream ended")))
    }

    /// Drops this sender: with no clone left, the request side of the stream closes.
    pub fn close(self) {}
}

/// The answering half of a `PublishStream`: one answer per publish, in order.
#[derive(Debug)]
pub struct PublishAnswers {
    responses: tonic::Streaming<pb::PublishResponse>,
}

impl PublishAnswers {
    /// The next answer; `None` once every publish was answered and the senders are gone.
    /// An invalid publish ends the stream with its error (earlier ones stay published).
    pub async fn next(&mut self) -> Result<Option<pb::PublishResponse>, Error> {
        Ok(self.responses.message().await?)
    }
}

pub(crate) async fn open(channel: AuthChannel, window: usize) -> Result<(PublishSender, PublishAnswers), Error> {
    let (tx, rx) = mpsc::channel(window.max(1));
    let responses = codec::streaming(channel, Method::PublishStream, ReceiverStream::new(rx)).await?;
    Ok((PublishSender { tx }, PublishAnswers { responses }))
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
        Some(error) => Err(tonic::Status::new(tonic::Code::from_i32(error.code), error.message).into()),
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
}
