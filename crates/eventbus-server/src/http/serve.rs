//! Serving the HTTP listener's connections with hyper (docs/limits.md): a deadline
//! for each request's headers (`server.http.header_read_timeout_ms`), parser limits
//! set above the router's own so that oversized URIs and headers get a JSON answer
//! (`guards`), each request marked in progress for the idle timeout, and a
//! graceful close when the server stops.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower_service::Service;
use tracing::debug;

use crate::listener::{Incoming, Tracked};

/// Headers hyper parses in one HTTP/1 request; past them it answers 431 itself, with no
/// body. The router refuses past [`super::guards::MAX_HEADERS`] first, in JSON.
const PARSED_HEADERS: usize = 256;
/// Header list an HTTP/2 request may carry (the router refuses past
/// [`super::guards::MAX_HEADER_BYTES`] first, in JSON).
const HTTP2_HEADER_LIST: u32 = 256 << 10;

/// Serves the connections `incoming` yields with `app` until `stop` is cancelled, then
/// closes them gracefully; returns once every connection is closed.
pub(crate) async fn serve(mut incoming: Incoming, app: Router, header_read_timeout: Duration, stop: CancellationToken) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_read_timeout).max_headers(PARSED_HEADERS);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(HTTP2_HEADER_LIST);
    // Each connection task holds a receiver: the sender sees them all gone.
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let conn = tokio::select! {
            () = stop.cancelled() => break,
            conn = incoming.next() => match conn {
                Some(conn) => conn,
                None => break,
            },
        };
        let peer = conn.peer().clone();
        let app = app.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let in_progress = peer.activity.begin();
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(ConnectInfo(peer.clone()));
            // The router is always ready (axum's `Router::poll_ready`).
            let response = app.clone().call(req);
            async move {
                let response = response.await.unwrap_or_else(|never: Infallible| match never {});
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, Some(in_progress))))
            }
        });
        let builder = builder.clone();
        let stop = stop.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let conn = builder.serve_connection(TokioIo::new(conn), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(err) = result {
                debug!(%err, "HTTP connection ended with an error");
            }
            drop(open);
        });
    }
    drop(open_rx);
    open_tx.closed().await;
}
