//! Background tasks that must run for as long as the daemon serves.
//!
//! A scheduler, a store writer, a Redis follower: each does work nobody asked for on a
//! call, so when one stops, nothing answers an error; timers just never fire again.
//! Every such task is started through a [`Supervisor`]. A task may end only when its
//! owner retires it (drops its [`TaskHandle`]) or the daemon stops
//! ([`Supervisor::stop`]); any other end, a return or a panic, is a failure: it is
//! logged as an error and reported on [`Supervisor::failures`], which turns readiness
//! and gRPC health to not serving so an orchestrator restarts the process.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::task::AbortHandle;

/// A background task that ended while it was still needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    /// Which task, e.g. `durable timer scheduler`.
    pub task: &'static str,
    /// How it ended (`returned`, or the panic message).
    pub cause: String,
}

impl std::fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "background task {:?} stopped: {}", self.task, self.cause)
    }
}

/// Starts background tasks and reports the ones that end while still needed. A cheap
/// handle; every clone reports to the same place.
#[derive(Debug, Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    stopping: AtomicBool,
    /// Tasks that have ended, expectedly or not.
    ended: AtomicU64,
    /// The first failure; later ones are logged only.
    failure: watch::Sender<Option<TaskFailure>>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                stopping: AtomicBool::new(false),
                ended: AtomicU64::new(0),
                failure: watch::Sender::new(None),
            }),
        }
    }

    /// The daemon is stopping: tasks may end from now on.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
    }

    /// Follows the first failure (`None` while every task runs).
    pub fn failures(&self) -> watch::Receiver<Option<TaskFailure>> {
        self.inner.failure.subscribe()
    }

    /// How many supervised tasks have ended so far, expectedly or not.
    pub fn ended(&self) -> u64 {
        self.inner.ended.load(Ordering::Acquire)
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<TaskFailure> {
        self.inner.failure.borrow().clone()
    }

    /// Spawns `task` on the current runtime. Its handle retires it: dropping the handle
    /// aborts the task, and only then (or after [`Supervisor::stop`]) may it end.
    pub fn spawn<F>(&self, name: &'static str, task: F) -> TaskHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let retired = Arc::new(AtomicBool::new(false));
        let join = tokio::spawn(task);
        let abort = join.abort_handle();
        let watcher = Watch { supervisor: self.clone(), name, retired: Arc::clone(&retired) };
        tokio::spawn(async move {
            let _ = match join.await {
                Ok(()) => watcher.ended("returned".to_owned()),
                Err(err) if err.is_panic() => watcher.ended(panic_message(err.into_panic())),
                // Aborted: its handle was dropped, an expected end.
                Err(_) => watcher.supervisor.inner.ended.fetch_add(1, Ordering::AcqRel),
            };
        });
        TaskHandle { retired, abort: Some(abort) }
    }

    /// Spawns `work` on a thread of its own, under the same rule as [`Supervisor::spawn`]
    /// (dropping the handle retires it; the thread must then end by itself).
    pub fn thread<F>(&self, name: &'static str, work: F) -> std::io::Result<TaskHandle>
    where
        F: FnOnce() + Send + 'static,
    {
        let retired = Arc::new(AtomicBool::new(false));
        let watcher = Watch { supervisor: self.clone(), name, retired: Arc::clone(&retired) };
        std::thread::Builder::new().name(name.replace(' ', "-")).spawn(move || {
            // Dropped on return and while unwinding from a panic alike.
            let _watcher = ThreadWatch(Some(watcher));
            work();
        })?;
        Ok(TaskHandle { retired, abort: None })
    }

    fn report(&self, failure: TaskFailure) {
        tracing::error!(task = failure.task, cause = %failure.cause, "a background task stopped while the daemon serves; marking the instance not ready");
        self.inner.failure.send_if_modified(|first| {
            if first.is_none() {
                *first = Some(failure);
                return true;
            }
            false
        });
    }
}

/// Retires its task when dropped: an async task is aborted, a thread is left to end by
/// itself (its owner closes what it reads). Either may end from then on.
#[derive(Debug)]
pub struct TaskHandle {
    retired: Arc<AtomicBool>,
    abort: Option<AbortHandle>,
}

impl TaskHandle {
    /// Dropping the handle will retire the task without aborting it: for a task that
    /// finishes its own work once its input closes (an actor draining its queue).
    pub fn without_abort(mut self) -> Self {
        self.abort = None;
        self
    }

    /// Lets the task run until the daemon stops ([`Supervisor::stop`]): it is never
    /// retired, and any end before the stop is a failure.
    pub fn detach(mut self) {
        self.abort = None;
        // What the watcher reads is no longer this handle's to set.
        self.retired = Arc::new(AtomicBool::new(false));
    }
}

impl Drop for TaskHandle {
    fn drop(&mut self) {
        self.retired.store(true, Ordering::Release);
        if let Some(abort) = &self.abort {
            abort.abort();
        }
    }
}

struct Watch {
    supervisor: Supervisor,
    name: &'static str,
    retired: Arc<AtomicBool>,
}

impl Watch {
    fn ended(&self, cause: String) -> u64 {
        let expected = self.retired.load(Ordering::Acquire) || self.supervisor.inner.stopping.load(Ordering::Acquire);
        if expected {
            tracing::debug!(task = self.name, "background task ended");
        } else {
            self.supervisor.report(TaskFailure { task: self.name, cause });
        }
        self.supervisor.inner.ended.fetch_add(1, Ordering::AcqRel)
    }
}

struct ThreadWatch(Option<Watch>);

impl Drop for ThreadWatch {
    fn drop(&mut self) {
        if let Some(watch) = self.0.take() {
            let cause = if std::thread::panicking() { "panicked" } else { "returned" };
            watch.ended(cause.to_owned());
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("panicked: {text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn failed(supervisor: &Supervisor) -> TaskFailure {
        let mut failures = supervisor.failures();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(10), failures.wait_for(Option::is_some)).await;
        seen.expect("a failure in time").expect("supervisor alive").clone().expect("some")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_returns_or_panics_while_needed_is_a_failure() {
        let supervisor = Supervisor::new();
        let _returns = supervisor.spawn("returns", async {});
        let failure = failed(&supervisor).await;
        assert_eq!((failure.task, failure.cause.as_str()), ("returns", "returned"));

        let supervisor = Supervisor::new();
        let _panics = supervisor.spawn("panics", async { panic!("boom") });
        assert_eq!(failed(&supervisor).await.cause, "panicked: boom");

        let supervisor = Supervisor::new();
        let _thread = supervisor.thread("thread panics", || panic!("bang")).unwrap();
        assert_eq!(failed(&supervisor).await.cause, "panicked");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn retired_or_stopping_tasks_end_quietly() {
        let supervisor = Supervisor::new();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = supervisor.thread("reader", move || while rx.recv().is_ok() {}).unwrap();
        let task = supervisor.spawn("forever", std::future::pending());
        drop(thread);
        drop(tx);
        drop(task);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while supervisor.ended() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "retired tasks did not end");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        supervisor.stop();
        let _late = supervisor.spawn("after stop", async {});
        while supervisor.ended() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "the task spawned after stop did not end");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert_eq!(supervisor.failure(), None);
    }
}
