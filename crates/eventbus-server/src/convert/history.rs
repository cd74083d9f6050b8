//! Channel histories: the admin page of one, in both wire forms.

use super::*;
use eventbus_core::history::{HistoryInfo, Recovery, parse_age};

use crate::ops::{HistoryFrom, HistoryPage, MAX_HISTORY_LIMIT};

pub(crate) fn history_response(page: HistoryPage) -> pb::GetChannelHistoryResponse {
    let HistoryPage { info, read: Recovery { events, complete: _, last: _, more } } = page;
    pb::GetChannelHistoryResponse {
        history: Some(channel_history(info)),
        events: events.iter().map(event).collect(),
        more,
    }
}

fn channel_history(info: HistoryInfo) -> pb::ChannelHistory {
    let HistoryInfo { channel, epoch, first_offset, last_offset, events, bytes } = info;
    pb::ChannelHistory { channel, epoch: epoch.to_string(), first_offset, last_offset, events, bytes }
}

/// `HistoryInfo` in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct ChannelHistoryJson {
    channel: String,
    epoch: String,
    first_offset: u64,
    last_offset: u64,
    events: u64,
    bytes: u64,
}

/// A page of a channel's history in JSON.
#[derive(Debug, Serialize)]
pub(crate) struct HistoryPageJson {
    history: ChannelHistoryJson,
    events: Vec<EventJson>,
    more: bool,
}

pub(crate) fn history_page_json(page: HistoryPage) -> HistoryPageJson {
    let HistoryPage { info, read: Recovery { events, complete: _, last: _, more } } = page;
    let HistoryInfo { channel, epoch, first_offset, last_offset, events: count, bytes } = info;
    HistoryPageJson {
        history: ChannelHistoryJson {
            channel,
            epoch: epoch.to_string(),
            first_offset,
            last_offset,
            events: count,
            bytes,
        },
        events: events.iter().map(|e| event_json(e)).collect(),
        more,
    }
}

/// `?limit=` of the REST history route: 1 to the maximum, or the default when absent.
pub(crate) fn history_limit_query(limit: Option<usize>) -> Result<usize, Refusal> {
    match limit {
        Some(0) => Err(Refusal::BadRequest(format!("limit must be 1 to {MAX_HISTORY_LIMIT}, not 0"))),
        limit => Ok(limit.unwrap_or(0)),
    }
}

/// `?since=` of the REST history route: an offset (`42`), a time (RFC 3339), or an age
/// (`90s`, `5m`, `2h`: that long ago).
pub(crate) fn history_from_query(since: Option<&str>) -> Result<HistoryFrom, Refusal> {
    let Some(since) = since.map(str::trim).filter(|s| !s.is_empty()) else { return Ok(HistoryFrom::Offset(0)) };
    if let Ok(offset) = since.parse::<u64>() {
        return Ok(HistoryFrom::Offset(offset));
    }
    if let Ok(t) = since.parse::<prost_types::Timestamp>() {
        return Ok(HistoryFrom::Time(valid_time("since", t)?));
    }
    if let Some(age) = parse_age(since) {
        return Ok(HistoryFrom::Time(SystemTime::now().checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH)));
    }
    Err(Refusal::BadRequest(format!(
        "invalid since {since:?}: expected an offset (42), a time (2026-11-27T10:00:00Z) or an age (90s, 5m, 2h)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_reads_offsets_times_and_ages() {
        assert_eq!(history_from_query(None).unwrap(), HistoryFrom::Offset(0));
        assert_eq!(history_from_query(Some("42")).unwrap(), HistoryFrom::Offset(42));
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(history_from_query(Some(&rfc3339(t))).unwrap(), HistoryFrom::Time(t));
        let HistoryFrom::Time(ago) = history_from_query(Some("5m")).unwrap() else { panic!("an age is a time") };
        let age = SystemTime::now().duration_since(ago).unwrap();
        assert!(age >= Duration::from_secs(300) && age < Duration::from_secs(360), "{age:?}");
        let err = history_from_query(Some("yesterday")).unwrap_err().to_string();
        assert!(err.contains("invalid since \"yesterday\""), "{err}");
        assert_eq!(parse_age("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_age("5"), None);
        assert_eq!(parse_age("m"), None);
    }
}
