//! Turning SIGINT/SIGTERM into the one shutdown signal, and SIGHUP into a reload.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGINT or SIGTERM.
pub async fn on_signal(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutdown requested");
    token.cancel();
    Ok(())
}

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
