//! Durable consumers: their configuration, state, deliveries and dead letters.

use super::*;

/// A consumer definition from the wire, created by `owner`; zero values take the
/// defaults.
pub(crate) fn consumer_config_from_pb(c: pb::ConsumerConfig, owner: &str) -> Result<ConsumerConfig, Refusal> {
    let pb::ConsumerConfig {
        name,
        channels,
        ack_deadline_ms,
        max_attempts,
        backoff,
        max_in_flight,
        dead_letter_channel,
        exclusive,
        max_pending,
        push,
    } = c;
    let defaults = ConsumerConfig::new(name.clone(), Vec::new());
    let b = backoff.unwrap_or_default();
    let db = Backoff::default();
    Ok(ConsumerConfig {
        name,
        channels,
        ack_deadline_ms: if ack_deadline_ms == 0 { defaults.ack_deadline_ms } else { ack_deadline_ms },
        max_attempts: max_attempts.unwrap_or(defaults.max_attempts),
        backoff: Backoff {
            initial_ms: if b.initial_ms == 0 { db.initial_ms } else { b.initial_ms },
            multiplier: if b.multiplier == 0.0 { db.multiplier } else { b.multiplier },
            max_ms: if b.max_ms == 0 { db.max_ms } else { b.max_ms },
            kind: backoff_kind_from_pb(b.kind)?,
        },
        max_in_flight: if max_in_flight == 0 { defaults.max_in_flight } else { max_in_flight },
        // The default as the views show it reads back as the default.
        dead_letter_channel: (!dead_letter_channel.is_empty() && dead_letter_channel != DEFAULT_DEAD_LETTER_SHOWN)
            .then_some(dead_letter_channel),
        owner: owner.to_owned(),
        exclusive,
        max_pending: max_pending.unwrap_or(defaults.max_pending),
        push: push.map(push_from_pb).transpose()?,
    })
}

/// A push endpoint from the wire; zero values take the defaults.
fn push_from_pb(p: pb::PushConfig) -> Result<PushConfig, Refusal> {
    let pb::PushConfig { url, headers, timeout_ms, max_concurrency, batch, envelope, secret } = p;
    let defaults = PushConfig::new(url);
    let envelope = match pb::PushEnvelope::try_from(envelope) {
        Ok(pb::PushEnvelope::Raw) => PushEnvelope::Raw,
        Ok(pb::PushEnvelope::Json) => PushEnvelope::Json,
        Err(_) => return Err(Refusal::BadRequest(format!("invalid push.envelope: unknown envelope {envelope}"))),
    };
    Ok(PushConfig {
        headers: headers.into_iter().collect(),
        timeout_ms: if timeout_ms == 0 { defaults.timeout_ms } else { timeout_ms },
        max_concurrency: if max_concurrency == 0 { defaults.max_concurrency } else { max_concurrency },
        batch: if batch == 0 { defaults.batch } else { batch },
        envelope,
        secret,
        ..defaults
    })
}

/// A push endpoint for the wire, its credentials redacted.
fn push(p: &PushConfig) -> pb::PushConfig {
    let PushConfig { url, headers, timeout_ms, max_concurrency, batch, envelope, secret } = p.redacted();
    let envelope = match envelope {
        PushEnvelope::Raw => pb::PushEnvelope::Raw,
        PushEnvelope::Json => pb::PushEnvelope::Json,
    };
    pb::PushConfig {
        url,
        headers: headers.into_iter().collect(),
        timeout_ms,
        max_concurrency,
        batch,
        envelope: envelope.into(),
        secret,
    }
}

fn backoff_kind_from_pb(kind: i32) -> Result<BackoffKind, Refusal> {
    match pb::BackoffKind::try_from(kind) {
        Ok(pb::BackoffKind::Exponential) => Ok(BackoffKind::Exponential),
        Ok(pb::BackoffKind::Linear) => Ok(BackoffKind::Linear),
        Err(_) => Err(Refusal::BadRequest(format!("invalid backoff.kind: unknown backoff kind {kind}"))),
    }
}

fn backoff_kind(kind: BackoffKind) -> pb::BackoffKind {
    match kind {
        BackoffKind::Exponential => pb::BackoffKind::Exponential,
        BackoffKind::Linear => pb::BackoffKind::Linear,
    }
}

fn consumer_config(c: &ConsumerConfig) -> pb::ConsumerConfig {
    let ConsumerConfig {
        name,
        channels,
        ack_deadline_ms,
        max_attempts,
        backoff,
        max_in_flight,
        dead_letter_channel,
        owner: _,
        exclusive,
        max_pending,
        push: push_config,
    } = c;
    let Backoff { initial_ms, multiplier, max_ms, kind } = *backoff;
    pb::ConsumerConfig {
        name: name.clone(),
        channels: channels.clone(),
        ack_deadline_ms: *ack_deadline_ms,
        max_attempts: Some(*max_attempts),
        backoff: Some(pb::Backoff { initial_ms, multiplier, max_ms, kind: backoff_kind(kind).into() }),
        max_in_flight: *max_in_flight,
        dead_letter_channel: dead_letter_channel.clone().unwrap_or_default(),
        exclusive: *exclusive,
        max_pending: Some(*max_pending),
        push: push_config.as_ref().map(push),
    }
}

pub(crate) fn consumer_info(i: &ConsumerInfo) -> pb::ConsumerInfo {
    let ConsumerInfo {
        config,
        pending,
        in_flight,
        clients,
        acked,
        dead_lettered,
        redelivered,
        redriven,
        dropped,
        paused,
        redrivable,
    } = i;
    pb::ConsumerInfo {
        config: Some(consumer_config(config)),
        pending: *pending,
        in_flight: *in_flight,
        clients: *clients,
        acked: *acked,
        dead_lettered: *dead_lettered,
        redelivered: *redelivered,
        owner: config.owner.clone(),
        paused: *paused,
        redrivable: *redrivable,
        redriven: *redriven,
        dropped: *dropped,
    }
}

/// `Backoff` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct BackoffJson {
    initial_ms: u64,
    multiplier: f64,
    max_ms: u64,
    kind: BackoffKind,
}

/// `ConsumerInfo` in JSON: the definition's fields and the counters side by side; no
/// dead-letter channel of its own reads `dlq.<channel>`, the default.
#[derive(Debug, Serialize)]
pub(crate) struct ConsumerJson {
    name: String,
    channels: Vec<String>,
    ack_deadline_ms: u64,
    max_attempts: u32,
    backoff: BackoffJson,
    max_in_flight: u32,
    dead_letter_channel: String,
    owner: String,
    exclusive: bool,
    max_pending: u64,
    /// Credentials redacted.
    #[serde(skip_serializing_if = "Option::is_none")]
    push: Option<PushConfig>,
    paused: bool,
    pending: u64,
    in_flight: u64,
    clients: u32,
    acked: u64,
    dead_lettered: u64,
    redelivered: u64,
    redriven: u64,
    redrivable: u64,
    dropped: u64,
}

pub(crate) fn consumer_info_json(i: &ConsumerInfo) -> ConsumerJson {
    let ConsumerInfo {
        config,
        pending,
        in_flight,
        clients,
        acked,
        dead_lettered,
        redelivered,
        redriven,
        dropped,
        paused,
        redrivable,
    } = i;
    let ConsumerConfig {
        name,
        channels,
        ack_deadline_ms,
        max_attempts,
        backoff,
        max_in_flight,
        dead_letter_channel,
        owner,
        exclusive,
        max_pending,
        push,
    } = config;
    let Backoff { initial_ms, multiplier, max_ms, kind } = *backoff;
    ConsumerJson {
        name: name.clone(),
        channels: channels.clone(),
        ack_deadline_ms: *ack_deadline_ms,
        max_attempts: *max_attempts,
        backoff: BackoffJson { initial_ms, multiplier, max_ms, kind },
        max_in_flight: *max_in_flight,
        dead_letter_channel: dead_letter_channel.clone().unwrap_or_else(|| DEFAULT_DEAD_LETTER_SHOWN.to_owned()),
        owner: owner.clone(),
        exclusive: *exclusive,
        max_pending: *max_pending,
        push: push.as_ref().map(PushConfig::redacted),
        paused: *paused,
        redriven: *redriven,
        redrivable: *redrivable,
        dropped: *dropped,
        pending: *pending,
        in_flight: *in_flight,
        clients: *clients,
        acked: *acked,
        dead_lettered: *dead_lettered,
        redelivered: *redelivered,
    }
}

pub(crate) fn delivery(d: &Delivery) -> pb::Delivery {
    let Delivery { event: e, attempt, deadline } = d;
    pb::Delivery { event: Some(event(e)), attempt: *attempt, deadline: Some(timestamp(*deadline)) }
}

/// Content type of published dead letters.
pub(crate) const DEAD_LETTER_CONTENT_TYPE: &str = "application/x-protobuf; type=eventbus.v1.DeadLetter";

/// The wire form of a dead letter, for `DurableOptions::dead_letter_encoder`.
pub(crate) fn encode_dead_letter(dl: &PublishedDeadLetter) -> (Bytes, String) {
    let PublishedDeadLetter { channel: _, event: e, consumer, owner, attempts, failures } = dl;
    let msg = pb::DeadLetter {
        event: Some(event(e)),
        consumer: consumer.clone(),
        owner: owner.clone(),
        attempts: *attempts,
        failures: failures.iter().map(failure).collect(),
    };
    (Bytes::from(msg.encode_to_vec()), DEAD_LETTER_CONTENT_TYPE.to_owned())
}
