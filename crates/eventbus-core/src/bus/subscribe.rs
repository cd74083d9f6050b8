//! Opening a subscription (defaults and limits applied to what was asked) and the
//! handle its streamer reads from.

use super::*;

impl Inner {
    /// The queued-bytes share of `owner`, shared with its other open subscriptions; its
    /// bound is the latest one given.
    fn owner_budget(&self, owner: &str, max: usize) -> Arc<OwnerBudget> {
        let mut budgets = self.owner_budgets.lock();
        if let Some(budget) = budgets.get(owner).and_then(std::sync::Weak::upgrade) {
            budget.set_max(max);
            return budget;
        }
        budgets.retain(|_, b| b.strong_count() > 0);
        let budget = Arc::new(OwnerBudget::new(max));
        budgets.insert(owner.to_owned(), Arc::downgrade(&budget));
        budget
    }

    /// Applies defaults and limits to a subscribe request.
    pub(super) fn spec(&self, opts: SubscribeOptions) -> Result<SubscriptionSpec, Error> {
        if opts.channels.is_empty() {
            return Err(Error::NoChannels);
        }
        if opts.channels.len() > MAX_SUBSCRIBE_CHANNELS {
            return Err(Error::TooManyChannels { count: opts.channels.len(), limit: MAX_SUBSCRIBE_CHANNELS });
        }
        let mut filters: Vec<Pattern> = Vec::with_capacity(opts.channels.len());
        for name in &opts.channels {
            let filter = Pattern::parse(name)?;
            if !filters.contains(&filter) {
                filters.push(filter);
            }
        }
        let capacity = match opts.queue_capacity {
            0 => self.config.default_queue_capacity,
            n if n > self.config.max_queue_capacity => {
                return Err(Error::QueueTooLarge { requested: n, limit: self.config.max_queue_capacity });
            }
            n => n,
        };
        let max_bytes = match opts.max_queue_bytes {
            0 => self.config.default_queue_bytes,
            n if n > self.config.max_queued_bytes => {
                return Err(Error::InvalidOption {
                    field: "max_queue_bytes",
                    message: format!("{n} is above max_queued_bytes = {}", self.config.max_queued_bytes),
                });
            }
            n => n,
        };
        let max_batch = match opts.max_batch {
            0 => self.config.max_batch,
            n if n > MAX_BATCH_LIMIT => {
                return Err(Error::InvalidOption {
                    field: "max_batch",
                    message: format!("{n} is above the limit of {MAX_BATCH_LIMIT}"),
                });
            }
            n => n,
        };
        check_label("group", &opts.group)?;
        check_label("name", &opts.name)?;
        let group: Option<Arc<str>> = (!opts.group.is_empty()).then(|| opts.group.into());
        let group_key = group.as_ref().map(|g| match opts.owner.is_empty() {
            true => Arc::clone(g),
            false => Arc::from(scoped_key(&opts.owner, g.to_string())),
        });
        let owner_budget =
            (opts.owner_max_queued_bytes != 0).then(|| self.owner_budget(&opts.owner, opts.owner_max_queued_bytes));
        Ok(SubscriptionSpec {
            filters,
            owner_budget,
            group,
            group_key,
            name: opts.name,
            peer: opts.peer,
            owner: opts.owner,
            capacity,
            max_bytes,
            overflow: opts.overflow.unwrap_or(self.config.overflow),
            max_batch,
        })
    }
}

pub(super) fn info(s: &Subscription) -> SubscriptionInfo {
    SubscriptionInfo {
        id: s.id.to_string(),
        channels: s.spec.filters.iter().map(|f| f.as_str().to_owned()).collect(),
        group: s.spec.group.as_deref().map(str::to_owned),
        name: s.spec.name.clone(),
        pending: s.pending() as u64,
        capacity: s.spec.capacity as u64,
        queued_bytes: s.queued_bytes() as u64,
        max_queue_bytes: s.spec.max_bytes as u64,
        delivered: s.delivered(),
        dropped: s.dropped(),
        overflow: s.spec.overflow,
        peer: s.spec.peer.clone(),
        owner: s.spec.owner.clone(),
        created_at: s.created_at,
    }
}

fn check_label(field: &'static str, value: &str) -> Result<(), Error> {
    let why = if value.len() > MAX_LABEL_BYTES {
        "longer than 256 bytes"
    } else if value.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    let shown: String = value.chars().take(40).collect();
    Err(Error::InvalidOption { field, message: format!("{shown:?} is {why}") })
}

/// An open subscription, owned by whoever streams it. Dropping it unsubscribes.
#[derive(Debug)]
pub struct SubscriptionHandle {
    pub(super) sub: Arc<Subscription>,
    pub(super) bus: Bus,
    /// Events recovered from history, delivered before the live ones.
    pub(super) recovered: std::collections::VecDeque<Arc<Event>>,
    /// Per recovered channel, the last position the subscriber has (from before or
    /// recovered): a live event at or before it is a copy and is skipped.
    pub(super) seam: HashMap<String, Position>,
}

impl SubscriptionHandle {
    /// The subscription id.
    pub fn id(&self) -> &str {
        &self.sub.id
    }

    /// Recovered events not delivered yet.
    pub fn recovered(&self) -> usize {
        self.recovered.len()
    }

    /// Waits for events and moves up to `max_batch` of them into `out` (which should
    /// be empty): recovered ones first, then live ones. `Err` says why the
    /// subscription ended, once nothing is left to deliver.
    pub async fn next_batch(&mut self, out: &mut Vec<Arc<Event>>) -> Result<(), CloseReason> {
        if !self.recovered.is_empty() {
            let mut bytes = 0;
            while let Some(event) = self.recovered.front() {
                bytes += event.approx_size();
                if !out.is_empty() && (out.len() == self.sub.spec.max_batch || bytes > MAX_BATCH_BYTES) {
                    break;
                }
                out.extend(self.recovered.pop_front());
            }
            return Ok(());
        }
        loop {
            self.sub.next_batch(MAX_BATCH_BYTES, out).await?;
            if self.seam.is_empty() {
                return Ok(());
            }
            let seam = &self.seam;
            out.retain(|e| match (seam.get(&e.channel), &e.position) {
                (Some(seen), Some(p)) => p.epoch != seen.epoch || p.offset > seen.offset,
                _ => true,
            });
            if !out.is_empty() {
                return Ok(());
            }
        }
    }
}

impl Drop for SubscriptionHandle {
    fn drop(&mut self) {
        self.bus.inner.remove(&self.sub.id, CloseReason::Unsubscribed);
    }
}
