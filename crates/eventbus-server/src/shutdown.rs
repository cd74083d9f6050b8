//! Turning SIGINT/SIGTERM into the one shutdown signal, and SIGHUP into a reload.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGINT or SIGTERM; a second one ends the process at
/// once, without waiting for the drain or for connections to close (the operator's
/// Ctrl-C twice). Committed durable data is safe either way: the store's commits are
/// atomic, as after a crash.
pub async fn on_signal(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut next = async || {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    };
    let name = next().await;
    tracing::info!(signal = name, "shutdown requested");
    token.cancel();
    let name = next().await;
    tracing::warn!(signal = name, "second signal: exiting now, without waiting for the shutdown to finish");
    std::process::exit(EXIT_FORCED);
}

/// The exit status after a second signal.
pub const EXIT_FORCED: i32 = 130;

/// Reloads on every SIGHUP (TLS files, principals, JWT keys) until `stop` is cancelled.
pub async fn reload_on_signal(reloader: crate::Reloader, stop: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            received = hup.recv() => if received.is_none() { return Ok(()) },
        }
        tracing::info!(signal = "SIGHUP", "reload requested");
        reloader.reload();
    }
}
