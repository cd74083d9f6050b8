//! Publishing: checking a publish, capturing it for durable consumers, handing it to
//! subscribers or the shared transport.

use super::*;

/// A publish's keys ("" = none).
pub(super) struct PublishKeys {
    ordering: String,
    idempotency: String,
}

impl PublishKeys {
    pub(super) fn request<'a>(&'a self, event: &'a Arc<Event>) -> CaptureRequest<'a> {
        CaptureRequest {
            event,
            ordering_key: (!self.ordering.is_empty()).then_some(self.ordering.as_str()),
            idempotency_key: (!self.idempotency.is_empty()).then_some(self.idempotency.as_str()),
        }
    }
}

impl Bus {
    /// Validates and publishes one event.
    pub async fn publish(&self, input: PublishInput) -> Result<Published, Error> {
        self.publish_within(input, self.inner.config.max_payload_bytes, &mut RecentChannel::default()).await
    }

    /// [`Bus::publish`] with its own payload limit.
    pub(super) async fn publish_within(
        &self,
        input: PublishInput,
        max_payload_bytes: usize,
        recent: &mut RecentChannel,
    ) -> Result<Published, Error> {
        let start = Instant::now();
        let (event, keys) = self.prepare(input, max_payload_bytes, ChannelCheck::Needed, Stamp::now())?;
        let Some(durable) = self.inner.durable.get() else {
            return self.deliver(event, start, recent).await;
        };
        let r = keys.request(&event);
        let began = Instant::now();
        let captured = durable.capture(r.event, r.ordering_key, r.idempotency_key).await?;
        self.complete(event, captured, CaptureTime::since(start, began), recent).await
    }

    /// Publishes several events of one publisher (the requests of a `PublishStream`
    /// that arrived together), in order: the durable capture of all of them shares one
    /// round trip where the engine allows it. The answers come in the same order and
    /// stop at the first error, which is then the last answer; the events after it
    /// go unanswered (see [`DurableBackend::capture_many`]).
    pub async fn publish_many(&self, inputs: Vec<PublishInput>) -> Vec<Result<Published, Error>> {
        let start = Instant::now();
        let mut out = Vec::with_capacity(inputs.len());
        let Some(durable) = self.inner.durable.get().filter(|_| inputs.len() > 1) else {
            if self.inner.transport.is_some() && self.inner.durable.get().is_none() {
                // Sent together (see `publish_together`); the answers still stop at the
                // first error, and nothing after a refused event is sent.
                for published in self.publish_together(inputs, true).await {
                    let failed = published.is_err();
                    out.push(published);
                    if failed {
                        break;
                    }
                }
                return out;
            }
            let mut recent = RecentChannel::default();
            for input in inputs {
                let published = self.publish_within(input, self.inner.config.max_payload_bytes, &mut recent).await;
                let failed = published.is_err();
                out.push(published);
                if failed {
                    break;
                }
            }
            return out;
        };
        let mut prepared = Vec::with_capacity(inputs.len());
        let mut refused = None;
        let stamp = Stamp::now();
        for input in inputs {
            let check = channel_check(prepared.last().map(|(e, _)| e), &input);
            match self.prepare(input, self.inner.config.max_payload_bytes, check, stamp) {
                Ok(prepared_one) => prepared.push(prepared_one),
                Err(err) => {
                    refused = Some(err);
                    break;
                }
            }
        }
        let began = Instant::now();
        let captured = {
            let requests: Vec<CaptureRequest<'_>> = prepared.iter().map(|(e, keys)| keys.request(e)).collect();
            durable.capture_many(&requests).await
        };
        let time = CaptureTime::since(start, began);
        let expected = prepared.len();
        let captured = prepared.into_iter().map(|(event, _)| event).zip(captured).collect();
        for published in self.complete_all(captured, time).await {
            let failed = published.is_err();
            out.push(published);
            if failed {
                return out;
            }
        }
        if out.len() < expected {
            // An engine that answered fewer events than it was given: say so rather
            // than leave a publisher without an answer.
            let answered = out.len();
            let reason = format!("the durable engine answered {answered} of {expected} publishes");
            out.push(Err(Error::Durable(DurableError::unavailable(reason))));
            return out;
        }
        out.extend(refused.map(Err));
        out
    }

    /// Publishes through the transport without waiting for one answer before sending the
    /// next ([`Transport::publish_all`]): one at a time would bound a publisher to one
    /// event per round trip. With `stop_at_refusal`, the events after the first one
    /// refused are neither sent nor answered: a stream answered one by one tells its
    /// publisher that nothing after a refusal was published, so it can send them again.
    async fn publish_together(
        &self,
        inputs: Vec<PublishInput>,
        stop_at_refusal: bool,
    ) -> Vec<Result<Published, Error>> {
        let start = Instant::now();
        let max_payload_bytes = self.inner.config.max_payload_bytes;
        let mut prepared: Vec<Result<Arc<Event>, Error>> = Vec::with_capacity(inputs.len());
        let stamp = Stamp::now();
        for input in inputs {
            let check = channel_check(prepared.last().and_then(|p| p.as_ref().ok()), &input);
            let event = self.prepare(input, max_payload_bytes, check, stamp).map(|(event, _)| event);
            let refused = event.is_err();
            prepared.push(event);
            if refused && stop_at_refusal {
                break;
            }
        }
        let Some(transport) = &self.inner.transport else { return Vec::new() };
        let events: Vec<Arc<Event>> = prepared.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
        let mut fanouts = transport.publish_all(events).await.into_iter();
        prepared
            .into_iter()
            .map(|prepared| {
                let event = prepared?;
                match fanouts.next() {
                    Some(fanout) => Ok(self.sent(&event, fanout?, start)),
                    None => Err(self.fewer_answers()),
                }
            })
            .collect()
    }

    /// Counts an event the transport sent, and answers its publisher.
    fn sent(&self, event: &Event, fanout: Fanout, start: Instant) -> Published {
        self.inner.channel(&event.channel).counters.mark_published(crate::stats::unix_micros(event.timestamp));
        self.inner.counters.published.fetch_add(1, Ordering::Relaxed);
        Published {
            event_id: event.id.clone(),
            delivered: fanout.delivered,
            failed: fanout.failed,
            duration: start.elapsed(),
            duplicate: false,
            captured: 0,
            capture: None,
        }
    }

    /// Publishes the events of one batch (`PublishBatch`) in order, and answers every
    /// one of them, in the same order: unlike [`Bus::publish_many`], a refused event
    /// does not stop the ones after it. The durable captures of the accepted events
    /// share one round trip where the engine allows it; should the engine fail part-way,
    /// the events it left unanswered are refused as not captured (like any publish
    /// whose answer was lost, a shared store may have captured some of them).
    pub async fn publish_each(&self, inputs: Vec<PublishInput>) -> Vec<Result<Published, Error>> {
        let mut out = Vec::with_capacity(inputs.len());
        let Some(durable) = self.inner.durable.get() else {
            if self.inner.transport.is_some() {
                return self.publish_together(inputs, false).await;
            }
            let mut recent = RecentChannel::default();
            for input in inputs {
                out.push(self.publish_within(input, self.inner.config.max_payload_bytes, &mut recent).await);
            }
            return out;
        };
        let start = Instant::now();
        let max_payload_bytes = self.inner.config.max_payload_bytes;
        let mut prepared: Vec<Result<(Arc<Event>, PublishKeys), Error>> = Vec::with_capacity(inputs.len());
        let stamp = Stamp::now();
        for input in inputs {
            let check = channel_check(prepared.last().and_then(|p| p.as_ref().ok()).map(|(e, _)| e), &input);
            prepared.push(self.prepare(input, max_payload_bytes, check, stamp));
        }
        let began = Instant::now();
        let captured = {
            let requests: Vec<CaptureRequest<'_>> =
                prepared.iter().filter_map(|p| p.as_ref().ok()).map(|(e, keys)| keys.request(e)).collect();
            if requests.is_empty() { Vec::new() } else { durable.capture_many(&requests).await }
        };
        let time = CaptureTime::since(start, began);
        let mut captured = captured.into_iter();
        let mut accepted = Vec::with_capacity(prepared.len());
        let mut refused = Vec::with_capacity(prepared.len());
        for prepared in prepared {
            match prepared {
                Err(err) => refused.push(Some(err)),
                Ok((event, _)) => {
                    let c = captured.next().unwrap_or_else(|| {
                        Err(DurableError::unavailable(
                            "not captured: the durable engine failed on an earlier event of the batch",
                        ))
                    });
                    accepted.push((event, c));
                    refused.push(None);
                }
            }
        }
        let mut completed = self.complete_all(accepted, time).await.into_iter();
        for refused in refused {
            out.push(match refused {
                Some(err) => Err(err),
                None => completed.next().unwrap_or_else(|| Err(self.fewer_answers())),
            });
        }
        out
    }

    /// [`Bus::complete`] for the events of one publisher, in order: through a transport,
    /// the stored ones are sent together ([`Transport::publish_all`]) rather than one
    /// round trip each.
    async fn complete_all(
        &self,
        captured: Vec<(Arc<Event>, Result<Captured, DurableError>)>,
        time: CaptureTime,
    ) -> Vec<Result<Published, Error>> {
        let start = time.start;
        let Some(transport) = &self.inner.transport else {
            let mut out = Vec::with_capacity(captured.len());
            let mut recent = RecentChannel::default();
            for (event, c) in captured {
                out.push(match c {
                    Ok(c) => self.complete(event, c, time, &mut recent).await,
                    Err(err) => Err(err.into()),
                });
            }
            return out;
        };
        let stored: Vec<Arc<Event>> =
            captured.iter().filter(|(_, c)| matches!(c, Ok(Captured::Stored(_)))).map(|(e, _)| Arc::clone(e)).collect();
        let mut fanouts = match stored.is_empty() {
            true => Vec::new(),
            false => transport.publish_all(stored).await,
        }
        .into_iter();
        captured
            .into_iter()
            .map(|(event, c)| match c {
                Ok(Captured::Stored(consumers)) => match fanouts.next() {
                    Some(fanout) => Ok(stored_for(self.sent(&event, fanout?, start), consumers, time)),
                    None => Err(self.fewer_answers()),
                },
                Ok(Captured::Duplicate(original)) => Ok(duplicate_of(original, time)),
                Ok(Captured::Forwarded { fanout, consumers }) => {
                    Ok(stored_for(self.sent(&event, fanout, start), consumers, time))
                }
                Err(err) => Err(err.into()),
            })
            .collect()
    }

    /// A transport that answered fewer events than it was given.
    fn fewer_answers(&self) -> Error {
        Error::Transport(TransportError {
            transport: self.mode(),
            reason: "the transport answered fewer events than it was given".to_owned(),
        })
    }

    /// Checks a publish and builds its event, stamped with `stamp` (one clock reading for
    /// the events of one call).
    fn prepare(
        &self,
        mut input: PublishInput,
        max_payload_bytes: usize,
        channel: ChannelCheck,
        stamp: Stamp,
    ) -> Result<(Arc<Event>, PublishKeys), Error> {
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        for (field, value, limit) in [
            ("ordering_key", &input.ordering_key, MAX_KEY_BYTES),
            ("idempotency_key", &input.idempotency_key, MAX_KEY_BYTES),
            ("source", &input.source, MAX_SOURCE_BYTES),
        ] {
            if value.len() > limit {
                return Err(Error::InvalidOption {
                    field,
                    message: format!("{} bytes is over the limit of {limit}", value.len()),
                });
            }
        }
        let keys = PublishKeys {
            ordering: std::mem::take(&mut input.ordering_key),
            idempotency: scoped_key(&input.idempotency_scope, std::mem::take(&mut input.idempotency_key)),
        };
        let event = Arc::new(input.into_event(max_payload_bytes, channel, stamp)?);
        if let Some(status) = &self.inner.transport_status {
            let status = *status.borrow();
            if !status.connected {
                // Fail fast while the shared medium is away, durable capture included.
                let reason = if status.stalled {
                    "connected but not answering health checks (hung or overloaded); the event was not published"
                } else {
                    "not connected; the event was not published"
                };
                return Err(Error::Transport(TransportError { transport: self.mode(), reason: reason.into() }));
            }
        }
        if self.inner.durable.get().is_none() && !keys.idempotency.is_empty() {
            // Promising "delivered once" and then not checking would be a silent lie.
            return Err(Error::InvalidOption {
                field: "idempotency_key",
                message: "needs durable consumers, which this broker does not run".into(),
            });
        }
        Ok((event, keys))
    }

    /// Finishes a publish the durable engine has captured: a duplicate is answered as
    /// such, an event the engine forwarded is done, a stored one goes to subscribers.
    async fn complete(
        &self,
        event: Arc<Event>,
        captured: Captured,
        time: CaptureTime,
        recent: &mut RecentChannel,
    ) -> Result<Published, Error> {
        let start = time.start;
        match captured {
            Captured::Duplicate(original) => Ok(duplicate_of(original, time)),
            Captured::Forwarded { fanout, consumers } => {
                Ok(stored_for(self.sent(&event, fanout, start), consumers, time))
            }
            Captured::Stored(consumers) => {
                self.deliver(event, start, recent).await.map(|p| stored_for(p, consumers, time))
            }
        }
    }

    /// Hands an event to the local subscribers or the shared transport.
    async fn deliver(&self, event: Arc<Event>, start: Instant, recent: &mut RecentChannel) -> Result<Published, Error> {
        let event_id = event.id.clone();
        let fanout = match &self.inner.transport {
            None => self.inner.dispatch_local(event, true, recent).await,
            Some(transport) => {
                let fanout = transport.publish(Arc::clone(&event)).await?;
                return Ok(self.sent(&event, fanout, start));
            }
        };
        Ok(Published {
            event_id,
            delivered: fanout.delivered,
            failed: fanout.failed,
            duration: start.elapsed(),
            duplicate: false,
            captured: 0,
            capture: None,
        })
    }
}

/// `published`, stored by `consumers` durable consumers.
fn stored_for(published: Published, consumers: usize, time: CaptureTime) -> Published {
    Published { captured: u32::try_from(consumers).unwrap_or(u32::MAX), capture: Some(time.timing()), ..published }
}

/// The answer to a publish whose idempotency key names an earlier event.
fn duplicate_of(original: String, time: CaptureTime) -> Published {
    Published {
        event_id: original.into(),
        delivered: 0,
        failed: 0,
        duration: time.start.elapsed(),
        duplicate: true,
        captured: 0,
        capture: Some(time.timing()),
    }
}

/// When a publish began, and when and for how long the durable engine held it.
#[derive(Debug, Clone, Copy)]
struct CaptureTime {
    start: Instant,
    after: Duration,
    took: Duration,
}

impl CaptureTime {
    /// The capture that began at `began` of a publish that began at `start`, and ends now.
    fn since(start: Instant, began: Instant) -> Self {
        Self { start, after: began.duration_since(start), took: began.elapsed() }
    }

    fn timing(self) -> CaptureTiming {
        CaptureTiming { after: self.after, took: self.took }
    }
}

/// A name within a principal's scope (an idempotency key as the durable engines keep
/// it, a group's routing key): `<scope length>:<scope>:<key>`, unambiguous whatever the
/// names contain; the key alone in the empty scope (authentication off).
pub(super) fn scoped_key(scope: &str, key: String) -> String {
    if scope.is_empty() || key.is_empty() {
        return key;
    }
    format!("{}:{scope}:{key}", scope.len())
}

/// A publish's channel is checked unless the publish before it in the same call, already
/// accepted, had the same one.
fn channel_check(previous: Option<&Arc<Event>>, input: &PublishInput) -> ChannelCheck {
    if previous.is_some_and(|e| e.channel == input.channel) { ChannelCheck::Done } else { ChannelCheck::Needed }
}
