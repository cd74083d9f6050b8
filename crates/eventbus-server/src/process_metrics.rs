//! The standard `process_*` metrics of a Linux process (CPU, memory, file descriptors,
//! threads, start time), read from `/proc/self` at each scrape: a few lines of `/proc`
//! rather than a `/proc` library in every build of the daemon.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, IntGauge};

/// Collects the `process_*` metrics at scrape time.
pub(crate) struct ProcessCollector {
    cpu_seconds: Counter,
    open_fds: IntGauge,
    max_fds: IntGauge,
    virtual_memory: IntGauge,
    resident_memory: IntGauge,
    start_time: IntGauge,
    threads: IntGauge,
    ticks_per_second: f64,
    page_size: i64,
}

/// The fields of `/proc/self/stat` the metrics need.
#[derive(Debug, PartialEq)]
struct Stat {
    /// User plus system time, in clock ticks.
    cpu_ticks: u64,
    threads: i64,
    /// Since boot, in clock ticks.
    start_ticks: u64,
    virtual_bytes: i64,
    resident_pages: i64,
}

impl ProcessCollector {
    pub(crate) fn new() -> prometheus::Result<Self> {
        let cpu_seconds =
            Counter::new("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")?;
        let open_fds = IntGauge::new("process_open_fds", "Number of open file descriptors.")?;
        let max_fds = IntGauge::new("process_max_fds", "Maximum number of open file descriptors.")?;
        let virtual_memory = IntGauge::new("process_virtual_memory_bytes", "Virtual memory size in bytes.")?;
        let resident_memory = IntGauge::new("process_resident_memory_bytes", "Resident memory size in bytes.")?;
        let start_time =
            IntGauge::new("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")?;
        let threads = IntGauge::new("process_threads", "Number of OS threads in the process.")?;
        Ok(Self {
            cpu_seconds,
            open_fds,
            max_fds,
            virtual_memory,
            resident_memory,
            start_time,
            threads,
            ticks_per_second: rustix::param::clock_ticks_per_second() as f64,
            page_size: rustix::param::page_size() as i64,
        })
    }

    fn parts(&self) -> [&dyn Collector; 7] {
        [
            &self.cpu_seconds,
            &self.open_fds,
            &self.max_fds,
            &self.virtual_memory,
            &self.resident_memory,
            &self.start_time,
            &self.threads,
        ]
    }

    /// Reads `/proc/self`; a file that cannot be read leaves its metrics as they were.
    fn update(&self) {
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(parse_stat) {
            let cpu = stat.cpu_ticks as f64 / self.ticks_per_second;
            let counted = self.cpu_seconds.get();
            if cpu > counted {
                self.cpu_seconds.inc_by(cpu - counted);
            }
            self.threads.set(stat.threads);
            self.virtual_memory.set(stat.virtual_bytes);
            self.resident_memory.set(stat.resident_pages * self.page_size);
            if let Some(boot) = std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(boot_time) {
                self.start_time.set(boot + (stat.start_ticks as f64 / self.ticks_per_second) as i64);
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(entries.count() as i64);
        }
        if let Some(max) = std::fs::read_to_string("/proc/self/limits").ok().as_deref().and_then(max_open_files) {
            self.max_fds.set(max);
        }
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.parts().into_iter().flat_map(|part| part.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.update();
        self.parts().into_iter().flat_map(|part| part.collect()).collect()
    }
}

/// The fields after the command name, which is in parentheses and may hold spaces.
fn parse_stat(text: &str) -> Option<Stat> {
    let fields: Vec<&str> = text.get(text.rfind(')')? + 1..)?.split_whitespace().collect();
    // `fields[0]` is field 3 of proc_pid_stat(5), the state.
    let field = |n: usize| fields.get(n - 3).copied();
    let number = |n: usize| field(n)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: number(14)? + number(15)?,
        threads: field(20)?.parse().ok()?,
        start_ticks: number(22)?,
        virtual_bytes: field(23)?.parse().ok()?,
        resident_pages: field(24)?.parse().ok()?,
    })
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(text: &str) -> Option<i64> {
    text.lines().find_map(|line| line.strip_prefix("btime ")).and_then(|t| t.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/self/limits` (`None` when unlimited).
fn max_open_files(text: &str) -> Option<i64> {
    let line = text.lines().find_map(|line| line.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_past_a_command_with_spaces_and_parentheses() {
        let line = "4242 (event (bus) d) S 1 4242 4242 0 -1 4194560 1234 0 0 0 150 50 0 0 20 0 7 0 98765 \
                    123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = parse_stat(line).unwrap();
        assert_eq!(
            stat,
            Stat { cpu_ticks: 200, threads: 7, start_ticks: 98765, virtual_bytes: 123456789, resident_pages: 2048 }
        );
        assert_eq!(parse_stat("4242 (truncated"), None);
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1764300000\nprocesses 9\n"), Some(1764300000));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(max_open_files("Max open files            unlimited            unlimited            files\n"), None);
    }

    #[test]
    fn this_process_is_measured() {
        let collector = ProcessCollector::new().unwrap();
        let families = collector.collect();
        let value = |name: &str| {
            let family = families.iter().find(|f| f.name() == name).unwrap_or_else(|| panic!("{name} missing"));
            let metric = &family.get_metric()[0];
            if name.ends_with("_total") { metric.get_counter().get_value() } else { metric.get_gauge().get_value() }
        };
        assert_eq!(families.len(), 7);
        assert_eq!(collector.desc().len(), 7);
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_open_fds") >= 3.0 && value("process_max_fds") > 0.0);
        assert!(value("process_threads") >= 1.0 && value("process_start_time_seconds") > 1.0e9);
    }
}
