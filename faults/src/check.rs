//! The checkers: from what the clients recorded, each promise's violations, each one
//! charged to the fault that was on (or had last been on) when it happened.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::workload::{Answer, Delivered, Records, TickItem, lock};

/// A fault's span in a run, for charging what happened to it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Window {
    pub(crate) faults: String,
    pub(crate) targets: Vec<&'static str>,
    pub(crate) start: f64,
    pub(crate) healed: f64,
    /// Seconds from the heal until every instance was ready again (`None`: not
    /// within the bound).
    pub(crate) ready_after: Option<f64>,
}

/// Counts for one promise set, overall or charged to one fault.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Counts {
    /// Durable publishes answered OK.
    pub(crate) durable_ok: u64,
    /// Durable publishes never answered OK (still being retried when publishing stopped).
    pub(crate) durable_unknown: u64,
    /// Answered OK and never delivered to the consumer (a promise broken).
    pub(crate) durable_lost: u64,
    /// Answered OK, not a duplicate, and stored by no consumer (a promise broken).
    pub(crate) durable_not_captured: u64,
    /// Events acked by the worker more than once (allowed: at least once).
    pub(crate) durable_duplicates: u64,
    /// Events of one ordering key first delivered out of publish order (a promise broken).
    pub(crate) order_violations: u64,
    /// Answered OK and never pushed to the push consumer's endpoint (a promise broken).
    pub(crate) push_lost: u64,
    /// Events the endpoint accepted more than once (allowed: at least once).
    pub(crate) push_duplicates: u64,
    /// Core events a recovering subscriber missed and was told about (allowed).
    pub(crate) ticks_missed_told: u64,
    /// Holes a subscriber was not told about: a false "no gap" (a promise broken).
    pub(crate) false_no_gap: u64,
    /// Core events missing in those holes.
    pub(crate) ticks_missed_untold: u64,
    /// Group events answered OK that reached no member (allowed: at most once, counted).
    pub(crate) group_lost: u64,
    /// Group events that reached more than one member (counted).
    pub(crate) group_duplicates: u64,
}

impl Counts {
    /// Violations of a promise eventbus makes in every configuration the harness runs.
    pub(crate) fn violations(&self) -> u64 {
        self.durable_lost + self.durable_not_captured + self.order_violations + self.push_lost + self.false_no_gap
    }
}

/// Counts overall and per fault.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Checked {
    pub(crate) total: Counts,
    pub(crate) by_fault: BTreeMap<String, Counts>,
    /// Spans in which a group's events reached no member (published within 0.5 s of
    /// each other): how long a group loses events after a fault.
    pub(crate) group_loss_spans: Vec<LossSpan>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct LossSpan {
    pub(crate) fault: String,
    pub(crate) from: f64,
    pub(crate) to: f64,
    pub(crate) events: u64,
}

impl Checked {
    fn add(&mut self, windows: &[Window], at: f64, bump: impl Fn(&mut Counts)) {
        bump(&mut self.total);
        bump(self.by_fault.entry(charge(windows, at)).or_default());
    }
}

/// The fault a moment belongs to: the last one started at or before it.
fn charge(windows: &[Window], at: f64) -> String {
    windows.iter().rev().find(|w| w.start <= at).map_or_else(|| "none".to_owned(), |w| w.faults.clone())
}

pub(crate) fn check(records: &Records, windows: &[Window]) -> Checked {
    let mut checked = Checked::default();
    durable(records, windows, &mut checked);
    pushed(records, windows, &mut checked);
    ticks(records, windows, &mut checked);
    group(records, windows, &mut checked);
    checked
}

/// Per event of `list`: its first delivery's time and how many times it was acked; a
/// second ack is a duplicate (`duplicate` counts it), charged to when it happened.
fn deliveries(
    list: &std::sync::Mutex<Vec<Delivered>>,
    windows: &[Window],
    checked: &mut Checked,
    duplicate: fn(&mut Counts),
) -> HashMap<(u32, u64), (f64, u64)> {
    let mut seen: HashMap<(u32, u64), (f64, u64)> = HashMap::new();
    for d in lock(list).iter() {
        let entry = seen.entry((d.key, d.seq)).or_insert((d.at, 0));
        entry.0 = entry.0.min(d.at);
        entry.1 += u64::from(d.acked);
        if d.acked && entry.1 > 1 {
            checked.add(windows, d.at, duplicate);
        }
    }
    seen
}

fn durable(records: &Records, windows: &[Window], checked: &mut Checked) {
    let published = lock(&records.published).clone();
    let seen = deliveries(&records.delivered, windows, checked, |c| c.durable_duplicates += 1);
    let mut by_key: BTreeMap<u32, Vec<(u64, f64)>> = BTreeMap::new();
    for p in &published {
        match p.answer {
            Answer::Unknown => checked.add(windows, p.at, |c| c.durable_unknown += 1),
            Answer::Ok { captured, duplicate } => {
                checked.add(windows, p.at, |c| c.durable_ok += 1);
                if captured == 0 && !duplicate {
                    checked.add(windows, p.at, |c| c.durable_not_captured += 1);
                }
                match seen.get(&(p.key, p.seq)) {
                    None => checked.add(windows, p.at, |c| c.durable_lost += 1),
                    Some(&(first, _)) => {
                        by_key.entry(p.key).or_default().push((p.seq, first));
                    }
                }
            }
        }
    }
    for events in by_key.values_mut() {
        events.sort_by_key(|(seq, _)| *seq);
        for pair in events.windows(2) {
            if pair[1].1 < pair[0].1 {
                checked.add(windows, pair[1].1, |c| c.order_violations += 1);
            }
        }
    }
}

/// The push consumer: every event answered OK reaches the endpoint at least once.
fn pushed(records: &Records, windows: &[Window], checked: &mut Checked) {
    let seen = deliveries(&records.pushed, windows, checked, |c| c.push_duplicates += 1);
    for p in lock(&records.published).iter() {
        if matches!(p.answer, Answer::Ok { .. }) && seen.get(&(p.key, p.seq)).is_none_or(|(_, acks)| *acks == 0) {
            checked.add(windows, p.at, |c| c.push_lost += 1);
        }
    }
}

fn ticks(records: &Records, windows: &[Window], checked: &mut Checked) {
    let ok: Vec<u64> = {
        let mut ok: Vec<u64> = lock(&records.ticks_ok).iter().map(|(seq, _)| *seq).collect();
        ok.sort_unstable();
        ok
    };
    let missing_between = |after: u64, before: u64| -> u64 {
        let from = ok.partition_point(|s| *s <= after);
        let to = ok.partition_point(|s| *s < before);
        to.saturating_sub(from) as u64
    };
    for items in &records.tick_items {
        let items = lock(items).clone();
        let mut last: Option<u64> = None;
        let mut told = false;
        for item in items {
            match item {
                TickItem::Gap | TickItem::Started { recovered: false } if last.is_some() => told = true,
                TickItem::Gap | TickItem::Started { .. } => {}
                TickItem::Event { seq, at } => {
                    if let Some(previous) = last
                        && seq > previous + 1
                    {
                        let missing = missing_between(previous, seq);
                        if missing > 0 && told {
                            checked.add(windows, at, |c| c.ticks_missed_told += missing);
                        } else if missing > 0 {
                            checked.add(windows, at, |c| {
                                c.false_no_gap += 1;
                                c.ticks_missed_untold += missing;
                            });
                        }
                    }
                    told = false;
                    last = Some(last.map_or(seq, |l| l.max(seq)));
                }
            }
        }
    }
}

fn group(records: &Records, windows: &[Window], checked: &mut Checked) {
    let mut receivers: HashMap<u64, u64> = HashMap::new();
    for (seq, _, _) in lock(&records.jobs_received).iter() {
        *receivers.entry(*seq).or_default() += 1;
    }
    for (seq, at) in lock(&records.jobs_ok).iter() {
        match receivers.get(seq).copied().unwrap_or(0) {
            0 => {
                checked.add(windows, *at, |c| c.group_lost += 1);
                match checked.group_loss_spans.last_mut() {
                    Some(span) if *at - span.to < 0.5 => {
                        span.to = *at;
                        span.events += 1;
                    }
                    _ => checked.group_loss_spans.push(LossSpan {
                        fault: charge(windows, *at),
                        from: *at,
                        to: *at,
                        events: 1,
                    }),
                }
            }
            1 => {}
            n => checked.add(windows, *at, |c| c.group_duplicates += n - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::workload::{Delivered, Published};

    const OK: Answer = Answer::Ok { captured: 1, duplicate: false };

    fn window(faults: &str, start: f64) -> Window {
        Window { faults: faults.to_owned(), targets: vec![], start, healed: start + 1.0, ready_after: Some(0.1) }
    }

    fn published(key: u32, seq: u64, at: f64, answer: Answer) -> Published {
        Published { key, seq, at, answer }
    }

    fn delivered(key: u32, seq: u64, at: f64, acked: bool) -> Delivered {
        Delivered { key, seq, at, acked }
    }

    #[test]
    fn durable_losses_duplicates_and_order_are_charged_to_their_fault() {
        let records = Records::new(Instant::now(), 0);
        let windows = [window("kill", 10.0)];
        lock(&records.published).extend([
            published(0, 0, 1.0, OK),
            published(0, 1, 11.0, OK),
            published(0, 2, 12.0, OK),
            published(0, 3, 13.0, Answer::Ok { captured: 0, duplicate: false }),
            published(0, 4, 14.0, Answer::Unknown),
        ]);
        lock(&records.delivered).extend([
            delivered(0, 0, 2.0, true),
            // Seq 2 first handled before seq 1: out of key order.
            delivered(0, 2, 12.5, true),
            delivered(0, 1, 12.6, false),
            delivered(0, 1, 12.7, true),
            delivered(0, 1, 12.8, true),
            delivered(0, 3, 13.5, true),
        ]);
        lock(&records.pushed).extend([delivered(0, 0, 2.0, true), delivered(0, 1, 12.0, true)]);
        let checked = check(&records, &windows);
        let (before, during) = (&checked.by_fault["none"], &checked.by_fault["kill"]);
        assert_eq!((before.durable_ok, before.durable_lost, before.push_lost), (1, 0, 0));
        assert_eq!((during.durable_ok, during.durable_unknown), (3, 1));
        assert_eq!(during.durable_lost, 0, "every event answered OK reached the worker");
        assert_eq!(during.durable_not_captured, 1);
        assert_eq!(during.durable_duplicates, 1, "seq 1 acked twice");
        assert_eq!(during.order_violations, 1);
        assert_eq!(during.push_lost, 2, "seqs 2 and 3 never reached the endpoint");
        assert_eq!(checked.total.violations(), 4);
    }

    #[test]
    fn an_ok_event_never_delivered_is_lost() {
        let records = Records::new(Instant::now(), 0);
        lock(&records.published).push(published(1, 0, 1.0, OK));
        let checked = check(&records, &[]);
        assert_eq!((checked.total.durable_lost, checked.total.push_lost), (1, 1));
    }

    #[test]
    fn a_hole_is_a_violation_unless_the_subscriber_was_told() {
        let records = Records::new(Instant::now(), 2);
        lock(&records.ticks_ok).extend((1..=10).map(|seq| (seq, seq as f64)));
        let event = |seq| TickItem::Event { seq, at: seq as f64 };
        // Told: a gap, then `recovered: false`, before the events after the hole.
        lock(&records.tick_items[0]).extend([
            TickItem::Started { recovered: false },
            event(1),
            event(2),
            TickItem::Gap,
            TickItem::Started { recovered: false },
            event(6),
            event(7),
        ]);
        // Not told: events 3 and 4 never came, and nothing said so.
        lock(&records.tick_items[1]).extend([
            TickItem::Started { recovered: false },
            event(1),
            event(2),
            TickItem::Started { recovered: true },
            event(5),
        ]);
        let checked = check(&records, &[]);
        assert_eq!(checked.total.ticks_missed_told, 3);
        assert_eq!((checked.total.false_no_gap, checked.total.ticks_missed_untold), (1, 2));
        assert_eq!(checked.total.violations(), 1);
    }

    #[test]
    fn group_events_lost_or_doubled_are_counted_in_spans() {
        let records = Records::new(Instant::now(), 0);
        lock(&records.jobs_ok).extend([(1, 1.0), (2, 1.1), (3, 1.2), (4, 5.0), (5, 5.1)]);
        lock(&records.jobs_received).extend([(1, 0, 1.0), (4, 0, 5.0), (4, 1, 5.0)]);
        let checked = check(&records, &[]);
        assert_eq!((checked.total.group_lost, checked.total.group_duplicates), (3, 1));
        let spans: Vec<(f64, f64, u64)> = checked.group_loss_spans.iter().map(|s| (s.from, s.to, s.events)).collect();
        assert_eq!(spans, [(1.1, 1.2, 2), (5.1, 5.1, 1)]);
        assert_eq!(checked.total.violations(), 0, "groups are at most once: counted, not broken");
    }
}
