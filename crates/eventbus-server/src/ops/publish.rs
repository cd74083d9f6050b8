//! Publishing: one event, a batch answered event by event, and the per-event check of
//! an open publish stream. Every publish is counted: its duration when accepted, its
//! refusal otherwise.

use eventbus_core::durable::DurableError;
use eventbus_core::{Error, PublishInput, Published};

use super::{Ops, Refusal};
use crate::access::{Caller, StreamGuard, StreamUse};

impl Ops {
    /// One event: the right to publish on its channel and room in the caller's rate,
    /// then the bus.
    pub(crate) async fn publish(&self, caller: &Caller, mut input: PublishInput) -> Result<Published, Refusal> {
        let span = self.spans.publish(&mut input);
        let published = match self.access.check_publish(caller, [&*input.channel]) {
            Ok(()) => self.bus.publish(input).await.map_err(Refusal::from),
            Err(refused) => Err(refused),
        };
        match &published {
            Ok(p) => self.observe(p),
            Err(refused) => self.count_refused(refused),
        }
        if let Some(span) = span {
            span.end(published.as_ref());
        }
        published
    }

    /// A batch, every event answered in its slot: the ones refused here (no right on
    /// their channel) or by the bus get their refusal and do not stop the others. Only
    /// what concerns the whole call (size, rate, shutdown) refuses it.
    pub(crate) async fn publish_batch(
        &self,
        caller: &Caller,
        inputs: Vec<PublishInput>,
    ) -> Result<Vec<Result<Published, Refusal>>, Refusal> {
        if inputs.len() > self.max_publish_batch {
            return Err(Refusal::BatchTooLarge { count: inputs.len(), limit: self.max_publish_batch });
        }
        if self.bus.is_shutting_down() {
            return Err(Error::ShuttingDown.into());
        }
        // `None`: the slot of an event handed to the bus, answered below in order.
        let mut answers: Vec<Option<Result<Published, Refusal>>> = Vec::with_capacity(inputs.len());
        let mut accepted = Vec::with_capacity(inputs.len());
        for input in inputs {
            match self.access.check_publish_right(caller, &input.channel) {
                Ok(()) => {
                    accepted.push(input);
                    answers.push(None);
                }
                Err(refused) => answers.push(Some(Err(refused))),
            }
        }
        self.access.take_publish_rate(caller, u32::try_from(accepted.len()).unwrap_or(u32::MAX))?;
        let spans = self.spans.publish_all(&mut accepted);
        let published = self.bus.publish_each(accepted).await;
        spans.end_all(&published);
        let mut published = published.into_iter();
        let answers: Vec<_> = answers
            .into_iter()
            .map(|slot| {
                let answer = slot.unwrap_or_else(|| match published.next() {
                    Some(answer) => answer.map_err(Refusal::from),
                    // The bus answers every input; should it not, the event is not
                    // reported as published.
                    None => Err(DurableError::unavailable("the broker gave no answer for this event").into()),
                });
                match &answer {
                    Ok(p) => self.observe(p),
                    Err(refused) => self.count_refused(refused),
                }
                answer
            })
            .collect();
        Ok(answers)
    }

    /// One event of an open publish stream: the right to publish on `channel` and room
    /// in the caller's rate, judged by the caller's rights of the moment.
    pub(crate) fn check_stream_publish(&self, caller: &Caller, channel: &str) -> Result<(), Refusal> {
        self.access.check_publish(caller, [channel])
    }

    /// Registers an open publish stream, so that a reload that removes its principal, or
    /// its credential's expiry, ends it.
    pub(crate) fn open_publisher(&self, caller: &Caller) -> Result<StreamGuard, Refusal> {
        self.access.open_stream(caller, StreamUse::Publish)
    }

    /// Records an accepted publish's duration.
    pub(crate) fn observe(&self, published: &Published) {
        if let Some(metrics) = &self.metrics {
            metrics.observe_publish(published.duration);
        }
    }

    /// Counts a refused publish.
    pub(crate) fn count_refused(&self, refused: &Refusal) {
        if let Some(metrics) = &self.metrics {
            metrics.count_refused(refused.codes().0);
        }
    }
}
