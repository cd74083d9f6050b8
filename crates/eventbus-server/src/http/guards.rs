//! What a request must be before any route: within the router's size limits, and, on
//! the admin and `/v1` routes, from this broker's own origin or an allowed one.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// Longest request target (path and query) the router reads; longer: 414.
pub(crate) const MAX_URI_BYTES: usize = 32 << 10;
/// Most headers in a request; more: 431.
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest header section (names and values); larger: 431.
pub(crate) const MAX_HEADER_BYTES: usize = 32 << 10;

/// URIs and header sections over the router's limits get a JSON 414 / 431. (hyper's
/// own parser limits sit above these and answer without a body: docs/limits.md.)
pub(super) async fn request_limits(req: axum::extract::Request, next: Next) -> Response {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the request target is {target} bytes; the limit is {MAX_URI_BYTES}"),
        )
        .into_response();
    }
    let headers = req.headers();
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "{} headers of {bytes} bytes; the limits are {MAX_HEADERS} headers and {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// Methods and request headers a page from an allowed origin may use (CORS preflight).
const CORS_METHODS: &str = "GET, POST, DELETE";
const CORS_HEADERS: &str = "authorization, content-type, last-event-id";
/// How long a browser may cache a preflight's answer, seconds.
const CORS_MAX_AGE: &str = "600";

/// How an admin request relates to the broker's origin.
enum Site {
    /// No `Origin` (curl, scripts, servers) or the broker's own: no CORS involved.
    Same,
    /// A foreign origin listed in `server.http.allowed_origins`.
    Allowed(HeaderValue),
}

/// The cross-site rules of admin routes (docs/security.md): a browser page from
/// another origin may not call them (403) unless its origin is in
/// `server.http.allowed_origins`, and then gets CORS headers (preflights answered
/// here, before authentication: a preflight carries no credentials); a body must be
/// `application/json` (`body`: 415), which also keeps "simple" cross-site form posts
/// out.
pub(super) async fn cross_site(
    State(allowed): State<Arc<[String]>>,
    req: axum::extract::Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if !(path.starts_with("/admin/") || path.starts_with("/v1/")) {
        return next.run(req).await;
    }
    let site = match req.headers().get(header::ORIGIN) {
        None => Site::Same,
        Some(origin) if is_same_origin(origin, req.headers(), req.uri()) => Site::Same,
        Some(origin) if origin.to_str().is_ok_and(|o| allowed.iter().any(|a| a.eq_ignore_ascii_case(o))) => {
            Site::Allowed(origin.clone())
        }
        Some(origin) => {
            let shown = eventbus_core::quoted(&String::from_utf8_lossy(origin.as_bytes()));
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!("cross-site request refused: origin {shown} is not this broker's and not in server.http.allowed_origins"),
            )
            .into_response();
        }
    };
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let mut response = StatusCode::NO_CONTENT.into_response();
        if let Site::Allowed(origin) = site {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(CORS_METHODS));
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static(CORS_HEADERS));
            headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(CORS_MAX_AGE));
            headers.insert(header::VARY, HeaderValue::from_static("origin"));
        }
        return response;
    }
    let mut response = next.run(req).await;
    if let Site::Allowed(origin) = site {
        response.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        response.headers_mut().append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

/// `Content-Type: application/json`, with or without parameters (`; charset=utf-8`).
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Whether `origin` names the host the request was sent to (its `Host`, or the
/// HTTP/2 authority), default ports aside. The scheme is not compared: TLS is a
/// property of the listener, not something a page can choose.
fn is_same_origin(origin: &HeaderValue, headers: &HeaderMap, uri: &axum::http::Uri) -> bool {
    let Some((scheme, authority)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else { return false };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).or_else(|| uri.authority().map(|a| a.as_str()));
    let Some(host) = host else { return false };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => "",
    };
    let normal = |a: &str| {
        let a = a.to_ascii_lowercase();
        match a.strip_suffix(default_port) {
            Some(bare) if !default_port.is_empty() => bare.to_owned(),
            _ => a,
        }
    };
    normal(authority) == normal(host)
}
