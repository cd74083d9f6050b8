//! The broker-wide views (stats, channels, subscriptions) an admin reads, and a
//! channel's history, which whoever may subscribe to the channel reads.

use std::sync::Arc;
use std::time::SystemTime;

use eventbus_core::history::{HistoryInfo, Position, Recovery, Start, Take};
use eventbus_core::{Bus, BusStats, ChannelStats, Error, SubscriptionInfo};

use super::{Ops, Refusal};
use crate::access::{Caller, Operation};

/// Largest page of a channel's history.
pub(crate) const MAX_HISTORY_LIMIT: usize = 1000;
/// Page size when the caller gives none.
const DEFAULT_HISTORY_LIMIT: usize = 100;

/// The admin-only reads, for a caller that is an admin.
#[derive(Debug)]
pub(crate) struct AdminOps<'a>(&'a Bus);

impl Ops {
    /// The admin-only reads, when the caller is an admin.
    pub(crate) fn admin(&self, caller: &Caller) -> Result<AdminOps<'_>, Refusal> {
        let allowed = caller.principal().permissions.is_admin();
        self.access.require(caller, Operation::Admin, allowed, || "an admin call".into())?;
        Ok(AdminOps(&self.bus))
    }

    /// A channel's history, for a caller that may subscribe to the channel: it may read
    /// what a subscription would recover.
    pub(crate) fn readable_history<'a>(
        &'a self,
        caller: &Caller,
        channel: &'a str,
    ) -> Result<HistoryReader<'a>, Refusal> {
        self.access.check_subscribe(caller, &[channel])?;
        Ok(HistoryReader { bus: &self.bus, channel })
    }
}

impl AdminOps<'_> {
    pub(crate) fn stats(&self) -> BusStats {
        self.0.stats()
    }

    pub(crate) fn channels(&self) -> Vec<ChannelStats> {
        self.0.channels()
    }

    pub(crate) fn subscriptions(&self) -> Vec<SubscriptionInfo> {
        self.0.subscriptions()
    }
}

/// One channel's history, for a caller allowed to read it.
#[derive(Debug)]
pub(crate) struct HistoryReader<'a> {
    bus: &'a Bus,
    channel: &'a str,
}

/// Where an admin read of a channel's history starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HistoryFrom {
    /// The events after this offset of the current epoch (0: the oldest kept).
    Offset(u64),
    /// The events published at or after this time.
    Time(SystemTime),
}

/// A page of one channel's history and what the history holds.
#[derive(Debug)]
pub(crate) struct HistoryPage {
    pub(crate) info: HistoryInfo,
    pub(crate) read: Recovery,
}

impl HistoryReader<'_> {
    /// A page of the channel's history; NOT_FOUND when no rule covers the channel.
    pub(crate) async fn page(&self, from: HistoryFrom, limit: usize) -> Result<HistoryPage, Refusal> {
        let (bus, channel) = (self.bus, self.channel);
        eventbus_core::name::validate_channel(channel).map_err(Error::from)?;
        let no_history = || Error::NoHistory(channel.to_owned());
        let info = bus.history_info(channel).await?.ok_or_else(no_history)?;
        let start = match from {
            HistoryFrom::Offset(0) => Start::Oldest,
            HistoryFrom::Offset(offset) => Start::After(Position { epoch: Arc::clone(&info.epoch), offset }),
            HistoryFrom::Time(t) => Start::At(t),
        };
        let limit = match limit {
            0 => DEFAULT_HISTORY_LIMIT,
            n if n > MAX_HISTORY_LIMIT => {
                return Err(Refusal::BadRequest(format!("limit {n} is over the maximum of {MAX_HISTORY_LIMIT}")));
            }
            n => n,
        };
        let read = bus.read_history(channel, &start, Take::First(limit)).await?.ok_or_else(no_history)?;
        Ok(HistoryPage { info, read })
    }
}
