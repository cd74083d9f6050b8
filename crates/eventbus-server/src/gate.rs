//! What a request must be to reach a route at all, before authentication
//! (docs/security.md "Cross-site requests", "DNS rebinding"):
//!
//! - addressed to a host the broker answers for (`server.http.allowed_hosts`), on the
//!   HTTP port, and on the gRPC port for gRPC-Web and anything over HTTP/1 (what a
//!   page's `fetch` sends): a page whose DNS name is rebound to the broker's address
//!   (a DNS rebinding attack) sends its own name as `Host`, and is refused with 421.
//!   IP addresses and `localhost` always pass: a rebound name is neither.
//! - on the gRPC port, a gRPC (or gRPC-Web) content type: anything else is a browser's
//!   "simple" cross-site request, refused with 415 before any service reads it.

use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, Version, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::Either;

use crate::http::ApiError;

/// `server.http.allowed_hosts`: the names requests may be addressed to. A cheap handle.
#[derive(Debug, Clone)]
pub(crate) struct AllowedHosts {
    /// `*`: any host.
    any: bool,
    /// Lowercase, each a name (any port) or `name:port`.
    names: Arc<[String]>,
}

impl AllowedHosts {
    pub(crate) fn new(configured: &[String]) -> Self {
        Self {
            any: configured.iter().any(|h| h == "*"),
            names: configured.iter().map(|h| h.trim_end_matches('.').to_ascii_lowercase()).collect(),
        }
    }

    /// Whether a request addressed to `authority` (its `Host`, or the HTTP/2
    /// `:authority`; `None`: neither) may go on.
    pub(crate) fn admits(&self, authority: Option<&str>) -> bool {
        let Some(authority) = authority else { return true };
        if self.any {
            return true;
        }
        let authority = authority.to_ascii_lowercase();
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => host,
            _ => authority.as_str(),
        };
        let host = host.trim_end_matches('.');
        match url::Host::parse(host) {
            Ok(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => return true,
            Ok(url::Host::Domain(name)) if name == "localhost" || name.ends_with(".localhost") => return true,
            Ok(url::Host::Domain(_)) => {}
            Err(_) => return false,
        }
        let with_port = authority.trim_end_matches('.');
        self.names.iter().any(|n| n == host || n == with_port)
    }

    /// Why a request addressed to `authority` is refused.
    pub(crate) fn refusal(authority: &str) -> String {
        format!(
            "requests addressed to host {} are refused: add it to server.http.allowed_hosts (IP addresses and \
             localhost always pass; * admits any)",
            eventbus_core::quoted(authority)
        )
    }
}

/// Where a request was addressed: its `Host`, else its URI's authority (HTTP/2).
fn authority<B>(req: &axum::http::Request<B>) -> Option<&str> {
    match req.headers().get(header::HOST) {
        Some(host) => Some(host.to_str().unwrap_or("\u{fffd}")),
        None => req.uri().authority().map(|a| a.as_str()),
    }
}

/// The HTTP port's host rule, before any route (an axum middleware).
pub(crate) async fn check_host(State(hosts): State<AllowedHosts>, req: axum::extract::Request, next: Next) -> Response {
    match authority(&req) {
        Some(to) if !hosts.admits(Some(to)) => {
            ApiError::new(StatusCode::MISDIRECTED_REQUEST, AllowedHosts::refusal(to)).into_response()
        }
        _ => next.run(req).await,
    }
}

/// The gRPC port's gate: gRPC content types only; gRPC-Web, CORS preflights and
/// HTTP/1 requests addressed to an allowed host only.
#[derive(Debug, Clone)]
pub(crate) struct GrpcGateLayer {
    pub(crate) hosts: AllowedHosts,
}

impl<S> tower_layer::Layer<S> for GrpcGateLayer {
    type Service = GrpcGate<S>;

    fn layer(&self, inner: S) -> GrpcGate<S> {
        GrpcGate { inner, hosts: self.hosts.clone() }
    }
}

/// See [`GrpcGateLayer`].
#[derive(Debug, Clone)]
pub(crate) struct GrpcGate<S> {
    inner: S,
    hosts: AllowedHosts,
}

/// What the gate makes of a request.
enum Verdict {
    Pass,
    Refuse(StatusCode, String),
}

fn verdict<B>(req: &axum::http::Request<B>, hosts: &AllowedHosts) -> Verdict {
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    // application/grpc, application/grpc+proto, application/grpc-web(-text)(+proto),
    // in any case (compared in place: this runs on every call).
    let starts_with = |prefix: &str| essence.get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix));
    let grpc = essence.eq_ignore_ascii_case("application/grpc") || starts_with("application/grpc+");
    // Native gRPC is HTTP/2, which a browser speaks only over TLS, where a rebound name
    // fails the certificate check: only HTTP/1 requests can come from a rebound page.
    if grpc && req.version() == Version::HTTP_2 {
        return Verdict::Pass;
    }
    let web = starts_with("application/grpc-web");
    let preflight = req.method() == Method::OPTIONS;
    if !(grpc || web || preflight) {
        let shown = if content_type.is_empty() { "none".to_owned() } else { eventbus_core::quoted(content_type) };
        return Verdict::Refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "the gRPC port takes gRPC and gRPC-Web requests only (content-type application/grpc or \
                 application/grpc-web); this one's is {shown}"
            ),
        );
    }
    match authority(req) {
        Some(to) if !hosts.admits(Some(to)) => {
            Verdict::Refuse(StatusCode::MISDIRECTED_REQUEST, AllowedHosts::refusal(to))
        }
        _ => Verdict::Pass,
    }
}

impl<S, ReqBody> tower_service::Service<axum::http::Request<ReqBody>> for GrpcGate<S>
where
    S: tower_service::Service<axum::http::Request<ReqBody>, Response = axum::http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = axum::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<Self::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<ReqBody>) -> Self::Future {
        match verdict(&req, &self.hosts) {
            Verdict::Pass => Either::Left(self.inner.call(req)),
            Verdict::Refuse(status, message) => {
                let mut response = axum::http::Response::new(tonic::body::Body::new(message));
                *response.status_mut() = status;
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                Either::Right(std::future::ready(Ok(response)))
            }
        }
    }
}

/// CORS on the gRPC port for the requests that carry an `Origin` (browsers' gRPC-Web):
/// the others, every native gRPC call, skip it, and with it the `Vary` header it would
/// add to each answer.
#[derive(Debug, Clone)]
pub(crate) struct BrowserCorsLayer(pub(crate) tower_http::cors::CorsLayer);

impl<S> tower_layer::Layer<S> for BrowserCorsLayer {
    type Service = BrowserCors<S>;

    fn layer(&self, inner: S) -> BrowserCors<S> {
        BrowserCors(self.0.layer(inner))
    }
}

/// See [`BrowserCorsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct BrowserCors<S>(tower_http::cors::Cors<S>);

impl<S, ReqBody, ResBody> tower_service::Service<axum::http::Request<ReqBody>> for BrowserCors<S>
where
    S: tower_service::Service<axum::http::Request<ReqBody>, Response = axum::http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = axum::http::Response<ResBody>;
    type Error = S::Error;
    type Future =
        Either<<tower_http::cors::Cors<S> as tower_service::Service<axum::http::Request<ReqBody>>>::Future, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Cors is ready when the service it wraps is.
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<ReqBody>) -> Self::Future {
        if req.headers().contains_key(header::ORIGIN) {
            Either::Left(self.0.call(req))
        } else {
            Either::Right(self.0.get_mut().call(req))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_localhost_always_pass_names_only_when_listed() {
        let default = AllowedHosts::new(&[]);
        for ok in [
            None,
            Some("127.0.0.1:8080"),
            Some("localhost:8080"),
            Some("LOCALHOST"),
            Some("localhost."),
            Some("app.localhost:3000"),
            Some("[::1]:8080"),
            Some("[::1]"),
            Some("10.1.2.3"),
        ] {
            assert!(default.admits(ok), "{ok:?}");
        }
        for refused in ["rebind.attacker.example", "rebind.attacker.example:8080", "localhost.attacker.example", ""] {
            assert!(!default.admits(Some(refused)), "{refused}");
        }
        let listed = AllowedHosts::new(&["eventbus.internal".into(), "Console.Example:8443".into()]);
        assert!(listed.admits(Some("eventbus.internal:8080")), "a name without a port admits any port");
        assert!(listed.admits(Some("EVENTBUS.internal.")));
        assert!(listed.admits(Some("console.example:8443")));
        assert!(!listed.admits(Some("console.example:8080")), "a name with a port admits that port only");
        assert!(!listed.admits(Some("attacker.example")));
        assert!(AllowedHosts::new(&["*".into()]).admits(Some("anything.example")));
        assert!(AllowedHosts::refusal("x.example").contains("server.http.allowed_hosts"));
    }

    #[test]
    fn the_grpc_port_takes_grpc_content_types_only() {
        let hosts = AllowedHosts::new(&[]);
        let req = |content_type: Option<&str>, host: &str, method: Method| {
            let mut b = axum::http::Request::builder()
                .method(method)
                .version(Version::HTTP_2)
                .uri("/eventbus.v1.EventBus/Publish")
                .header("host", host);
            if let Some(t) = content_type {
                b = b.header("content-type", t);
            }
            b.body(()).unwrap()
        };
        let status = |v: Verdict| match v {
            Verdict::Pass => StatusCode::OK,
            Verdict::Refuse(status, _) => status,
        };
        let far = "rebind.attacker.example";
        for t in ["application/grpc", "application/grpc+proto", "Application/GRPC; charset=x"] {
            assert_eq!(
                status(verdict(&req(Some(t), far, Method::POST), &hosts)),
                StatusCode::OK,
                "{t}: native gRPC keeps any authority"
            );
        }
        for t in [Some("text/plain"), Some("application/json"), Some("application/x-www-form-urlencoded"), None] {
            assert_eq!(
                status(verdict(&req(t, "localhost", Method::POST), &hosts)),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{t:?}"
            );
        }
        assert_eq!(
            status(verdict(&req(Some("application/grpc-web+proto"), "localhost:50051", Method::POST), &hosts)),
            StatusCode::OK
        );
        assert_eq!(
            status(verdict(&req(Some("application/grpc-web-text"), far, Method::POST), &hosts)),
            StatusCode::MISDIRECTED_REQUEST
        );
        assert_eq!(status(verdict(&req(None, far, Method::OPTIONS), &hosts)), StatusCode::MISDIRECTED_REQUEST);
        assert_eq!(status(verdict(&req(None, "127.0.0.1:50051", Method::OPTIONS), &hosts)), StatusCode::OK);
        // Over HTTP/1 (a page's fetch), gRPC is addressed to an allowed host too.
        let mut http1 = req(Some("application/grpc"), far, Method::POST);
        *http1.version_mut() = Version::HTTP_11;
        assert_eq!(status(verdict(&http1, &hosts)), StatusCode::MISDIRECTED_REQUEST);
        let mut http1 = req(Some("application/grpc"), "localhost", Method::POST);
        *http1.version_mut() = Version::HTTP_11;
        assert_eq!(status(verdict(&http1, &hosts)), StatusCode::OK);
    }
}
