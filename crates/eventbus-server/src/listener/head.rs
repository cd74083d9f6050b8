//! The deadline for an HTTP/1 request's headers on the gRPC listener.
//!
//! The HTTP listener's hyper enforces `server.http.header_read_timeout_ms` itself; the
//! gRPC listener (HTTP/1 for gRPC-Web beside HTTP/2) is served by tonic, which leaves
//! hyper's 30 s default. So its connections enforce the limit themselves: a connection
//! that opens with the HTTP/2 preface is left alone (its requests are frames, and idle
//! connections are the idle timeout's business); on an HTTP/1 one, the first byte that
//! arrives while no request is in progress starts the clock, and the request must have
//! begun (its headers read) before it runs out, or the connection fails.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::time::Duration;

use tracing::debug;

use super::Activity;

/// What an HTTP/2 connection opens with (its first bytes suffice to tell).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// See the module documentation.
#[derive(Debug)]
pub(super) struct HeadDeadline {
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// When the clock last started.
    armed_at: tokio::time::Instant,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing read yet.
    Unknown,
    /// HTTP/1; `armed` while a request's headers are arriving.
    Http1 { armed: bool },
}

/// What the connection does after a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Keep watching.
    Watch,
    /// HTTP/2: no more to watch.
    Done,
}

impl HeadDeadline {
    pub(super) fn new(timeout: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Self { timeout, sleep: Box::pin(tokio::time::sleep_until(now + timeout)), armed_at: now, state: State::Unknown }
    }

    /// Before a read: an error once a request's headers took longer than the timeout.
    /// Registers the reader's waker with the timer while armed.
    pub(super) fn check(&mut self, cx: &mut Context<'_>, activity: &Activity) -> io::Result<()> {
        let State::Http1 { armed: true } = self.state else { return Ok(()) };
        // A request in progress, or one that ended since the clock started (its
        // headers and body may have come in one read): the headers were read in time.
        if activity.in_progress.load(Ordering::Acquire) > 0 || *activity.idle_since.lock() >= self.armed_at {
            self.state = State::Http1 { armed: false };
            return Ok(());
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        debug!(timeout = ?self.timeout, "closing an HTTP/1 connection whose request headers did not arrive in time");
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "request headers not received within server.http.header_read_timeout_ms",
        ))
    }

    /// After a read that returned `read`.
    pub(super) fn received(&mut self, cx: &mut Context<'_>, read: &[u8], activity: &Activity) -> Verdict {
        if read.is_empty() {
            return Verdict::Watch;
        }
        if self.state == State::Unknown {
            let n = read.len().min(HTTP2_PREFACE.len());
            if read[..n] == HTTP2_PREFACE[..n] {
                return Verdict::Done;
            }
            self.state = State::Http1 { armed: false };
        }
        if self.state == (State::Http1 { armed: false }) && activity.in_progress.load(Ordering::Acquire) == 0 {
            self.state = State::Http1 { armed: true };
            self.armed_at = tokio::time::Instant::now();
            self.sleep.as_mut().reset(self.armed_at + self.timeout);
            // Registers the waker: the timer wakes a reader left waiting for the rest.
            let _ = self.sleep.as_mut().poll(cx);
        }
        Verdict::Watch
    }
}
