//! `eventbus subscribe`.

use std::io::Write as _;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use eventbus_client::{Client, SubscribeOptions, SubscriptionItem, pb};
use eventbus_core::history::parse_age;

use crate::cli::SubscribeArgs;
use crate::output;

/// `--since`: where in the past a subscription starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Since {
    /// That long before the command started.
    Age(Duration),
    /// From this time.
    Time(prost_types::Timestamp),
    /// After this position of the one channel subscribed to.
    Position(pb::EventPosition),
}

/// `90s`, `5m`, `2h`, `1d` (or `500ms`); an RFC 3339 time; `EPOCH:OFFSET`.
pub(crate) fn parse_since(s: &str) -> Result<Since, String> {
    if let Some(age) = parse_age(s) {
        return Ok(Since::Age(age));
    }
    if let Ok(time) = s.parse::<prost_types::Timestamp>() {
        eventbus_proto::time::check_timestamp(&time).map_err(|e| format!("invalid time {s:?}: {e}"))?;
        return Ok(Since::Time(time));
    }
    // An epoch is opaque, printable and without `:`; a date that did not parse as a
    // time above is a mistyped time, not an epoch.
    if let Some((epoch, offset)) = s.split_once(':')
        && !epoch.is_empty()
        && epoch.bytes().all(|b| b.is_ascii_graphic())
        && !looks_like_a_date(epoch)
        && let Ok(offset) = offset.parse::<u64>()
    {
        return Ok(Since::Position(pb::EventPosition { epoch: epoch.to_owned(), offset }));
    }
    Err(format!(
        "expected an age (90s, 5m, 2h, 1d), a time (2026-11-27T10:00:00Z) or a position EPOCH:OFFSET, got {s:?}"
    ))
}

/// Starts like `2026-11-27`.
fn looks_like_a_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 10 && b[4] == b'-' && b[7] == b'-' && b[..4].iter().all(u8::is_ascii_digit)
}

impl Since {
    /// The request's `since` for a subscription to `channels`, read `now`.
    fn request(&self, channels: &[String], now: SystemTime) -> anyhow::Result<pb::SubscribeSince> {
        Ok(match self {
            Self::Age(age) => pb::SubscribeSince {
                timestamp: Some(now.checked_sub(*age).unwrap_or(SystemTime::UNIX_EPOCH).into()),
                ..Default::default()
            },
            Self::Time(time) => pb::SubscribeSince { timestamp: Some(*time), ..Default::default() },
            Self::Position(position) => match channels {
                [channel] if !channel.split('.').any(|token| token == "*" || token == ">") => {
                    pb::SubscribeSince { positions: [(channel.clone(), position.clone())].into(), ..Default::default() }
                }
                _ => bail!(
                    "--since EPOCH:OFFSET is a position in one channel's history: subscribe to that one exact \
                     channel (not a pattern), or give an age or a time (got {})",
                    channels.join(" ")
                ),
            },
        })
    }
}

pub(crate) async fn run(client: &Client, json: bool, args: SubscribeArgs) -> anyhow::Result<()> {
    let since = args.since.as_ref().map(|s| s.request(&args.patterns, SystemTime::now())).transpose()?;
    let req = pb::SubscribeRequest {
        channels: args.patterns.clone(),
        group: args.group.clone().unwrap_or_default(),
        queue_capacity: args.queue_capacity,
        max_queue_bytes: args.max_queue_bytes,
        overflow: args.overflow.map_or(pb::OverflowPolicy::Unspecified, Into::into) as i32,
        max_batch: args.max_batch,
        name: args.name.clone(),
        since: since.clone(),
    };
    let req_since = since;
    // Lost (a broker restart, say), it is made again from where it was: channels with a
    // history give back what was missed, the rest is reported as a gap. With
    // --no-reconnect, a loss ends the command.
    let mut subscription = client.subscribe(SubscribeOptions::from(req).reconnect(!args.no_reconnect)).await?;
    let mut received = 0u64;
    let mut first = true;
    if args.count == Some(0) {
        return Ok(());
    }
    loop {
        let message = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            item = subscription.next() => item,
        };
        match message.transpose()? {
            None => {
                note("subscription closed by the broker");
                return Ok(());
            }
            Some(SubscriptionItem::Started { subscription_id, recovered }) => {
                note(&format!("subscribed {subscription_id} to {}", args.patterns.join(" ")));
                if first {
                    if args.since.is_some() {
                        let asked = req_since.as_ref().and_then(|since| since.timestamp.as_ref());
                        note(&since_note(client, recovered, asked).await);
                    }
                } else if recovered {
                    note("recovered: every event published while the subscription was lost was delivered");
                }
                first = false;
            }
            Some(SubscriptionItem::Gap { reason }) => note(&gap_note(&reason, args.group.is_some())),
            Some(SubscriptionItem::Events(events)) => {
                let mut out = std::io::stdout().lock();
                for event in &events {
                    let line = if json { output::event_json(event).to_string() } else { output::event_line(event) };
                    if writeln!(out, "{line}").is_err() {
                        return Ok(()); // stdout closed (e.g. `| head`): nothing left to do
                    }
                    received += 1;
                    if args.count == Some(received) {
                        let _ = out.flush();
                        return Ok(());
                    }
                }
                if out.flush().is_err() {
                    return Ok(());
                }
            }
            Some(_) => {}
        }
    }
}

/// Whether the start asked for with `--since` was recovered. When it was not and the
/// broker (in_memory mode, whose history lives in the process) started after the time
/// asked for, that is the whole story: its history begins at its start.
async fn since_note(client: &Client, recovered: bool, asked: Option<&prost_types::Timestamp>) -> String {
    if recovered {
        return "--since: every event asked for was recovered; live events follow".into();
    }
    if let Some(asked) = asked
        && let Ok(stats) = client.stats().await
        && stats.mode == "in_memory"
        && let Some(started) = stats.started_at
        && (started.seconds, started.nanos) > (asked.seconds, asked.nanos)
    {
        return history_begins_note(asked, &started);
    }
    "--since: history does not reach back to everything asked for (it was trimmed, or begins later, or a \
     channel keeps none); what is kept comes first, then live events"
        .into()
}

/// The broker started after the time asked for.
fn history_begins_note(asked: &prost_types::Timestamp, started: &prost_types::Timestamp) -> String {
    let seconds = |t: &prost_types::Timestamp| prost_types::Timestamp { seconds: t.seconds, nanos: 0 };
    format!(
        "--since: the broker started at {}, after the time asked for ({}): its history begins there, and \
         what it kept since came first; live events follow",
        seconds(started),
        seconds(asked)
    )
}

/// A loss that history did not make up for. In a group, reported at once; otherwise
/// once subscribed again.
fn gap_note(reason: &str, grouped: bool) -> String {
    if grouped {
        format!("gap: the subscription was lost ({reason}); events published until it is made again are missed")
    } else {
        format!(
            "gap: the subscription was lost ({reason}); history did not hold everything published meanwhile, so \
             some of it is missed"
        )
    }
}

/// A status line on stderr; a closed stderr is not worth failing for.
fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(list: &[&str]) -> Vec<String> {
        list.iter().map(|c| (*c).to_owned()).collect()
    }

    #[test]
    fn since_reads_ages_times_and_positions() {
        assert_eq!(parse_since("5m"), Ok(Since::Age(Duration::from_secs(300))));
        assert_eq!(parse_since("90s"), Ok(Since::Age(Duration::from_secs(90))));
        assert_eq!(parse_since("2h"), Ok(Since::Age(Duration::from_secs(7200))));
        let Ok(Since::Time(time)) = parse_since("2026-11-27T10:00:00Z") else { panic!("a time") };
        assert_eq!(time.to_string(), "2026-11-27T10:00:00Z");
        assert!(matches!(parse_since("2026-11-27T10:00:00+01:00"), Ok(Since::Time(_))));
        assert!(matches!(parse_since("2026-11-27T10:00:00"), Ok(Since::Time(_))), "UTC, not a position");
        let position = pb::EventPosition { epoch: "18f0a1b2c3d4".into(), offset: 42 };
        assert_eq!(parse_since("18f0a1b2c3d4:42"), Ok(Since::Position(position)));
        let position = pb::EventPosition { epoch: "1a21c28940ef000.3".into(), offset: 7 };
        assert_eq!(parse_since("1a21c28940ef000.3:7"), Ok(Since::Position(position)), "an epoch is opaque");
        for bad in ["yesterday", "5", "m", "2026-11-27T10:00", ":4", "e:x", "a b:1", ""] {
            let err = parse_since(bad).unwrap_err();
            assert!(err.contains("EPOCH:OFFSET") && err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn a_time_outside_years_1_to_9999_is_refused_by_name() {
        for bad in ["+10000-01-01T00:00:00Z", "-0001-01-01T00:00:00Z"] {
            let err = parse_since(bad).unwrap_err();
            assert!(err.contains("invalid time") && err.contains("years 1 to 9999"), "{bad}: {err}");
        }
        assert!(matches!(parse_since("9999-12-31T23:59:59Z"), Ok(Since::Time(_))));
        assert!(matches!(parse_since("0001-01-01T00:00:00Z"), Ok(Since::Time(_))));
    }

    #[test]
    fn an_age_or_a_time_covers_every_channel_and_a_position_one_exact_channel() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let since = Since::Age(Duration::from_secs(60)).request(&channels(&["a.>", "b"]), now).unwrap();
        assert_eq!(since.timestamp, Some(prost_types::Timestamp { seconds: 940, nanos: 0 }));
        assert!(since.positions.is_empty());

        let position = Since::Position(pb::EventPosition { epoch: "e".into(), offset: 7 });
        let since = position.request(&channels(&["orders.created"]), now).unwrap();
        assert_eq!((since.positions["orders.created"].offset, since.timestamp), (7, None));
        for wrong in [&["orders.*"][..], &["orders.>"], &["a", "b"]] {
            let err = position.request(&channels(wrong), now).unwrap_err().to_string();
            assert!(err.contains("one exact channel"), "{err}");
        }
    }
}
