//! Errors people can read. (Connections are `eventbus_bench::client`'s, shared with the
//! bench.)

/// One line for a failed call: the broker's message and the status code.
pub(crate) fn status_error(status: tonic::Status) -> anyhow::Error {
    let message = if status.message().is_empty() { "no details" } else { status.message() };
    anyhow::anyhow!("{message} ({:?})", status.code())
}
