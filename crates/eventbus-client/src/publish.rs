//! Pipelined publishing over one `PublishStream`: a sender half and an answers half.

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
