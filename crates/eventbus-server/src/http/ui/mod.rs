//! The web console (docs/web.md): four static files compiled into the binary and served
//! at `/ui/` on the HTTP port. The page calls the same routes as any other client (the
//! admin REST routes and `/v1/`), with the operator's credential; serving it needs none.
//!
//! Every answer carries a strict Content-Security-Policy (nothing but this origin; no
//! inline script or style, no framing) and `cache-control: no-cache`, so a browser
//! revalidates after an upgrade instead of mixing two versions' files.

use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const CHART_JS: &str = include_str!("chart.js");
const APP_CSS: &str = include_str!("app.css");

/// The console's Content-Security-Policy: its own files only (images may be `data:`
/// URLs), never inside a frame.
pub(crate) const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

/// `GET /ui` (a 308 to `/ui/`), `GET /ui/`, `/ui/app.js`, `/ui/chart.js`, `/ui/app.css`.
pub(crate) fn routes() -> Router<crate::http::HttpState> {
    assets()
}

/// The routes, for any router state (they read none).
fn assets<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route("/ui/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }))
        .route("/ui/chart.js", get(|| async { asset(CHART_JS, "text/javascript; charset=utf-8") }))
        .route("/ui/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }))
}

/// One embedded file with its content type and the console's headers.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 5] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    (headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use tower_service::Service;

    use super::*;

    async fn get(path: &str) -> Response {
        let mut router = assets::<()>();
        router.call(Request::get(path).body(Body::empty()).unwrap()).await.unwrap()
    }

    fn header<'a>(response: &'a Response, name: &HeaderName) -> &'a str {
        response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    #[tokio::test]
    async fn assets_are_served_with_their_types_and_the_console_headers() {
        for (path, content_type, body) in [
            ("/ui/", "text/html; charset=utf-8", INDEX_HTML),
            ("/ui/app.js", "text/javascript; charset=utf-8", APP_JS),
            ("/ui/chart.js", "text/javascript; charset=utf-8", CHART_JS),
            ("/ui/app.css", "text/css; charset=utf-8", APP_CSS),
        ] {
            let response = get(path).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(header(&response, &header::CONTENT_TYPE), content_type, "{path}");
            assert_eq!(header(&response, &header::CACHE_CONTROL), "no-cache", "{path}");
            assert_eq!(header(&response, &header::CONTENT_SECURITY_POLICY), CSP, "{path}");
            assert_eq!(header(&response, &header::X_CONTENT_TYPE_OPTIONS), "nosniff", "{path}");
            let read = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            assert_eq!(read, body.as_bytes(), "{path}");
        }
    }

    #[tokio::test]
    async fn the_bare_path_redirects_to_the_directory() {
        let response = get("/ui").await;
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(header(&response, &header::LOCATION), "/ui/");
    }

    /// The page works under `default-src 'self'`: no inline script or style, nothing
    /// from another origin; and it stays small.
    #[test]
    fn the_page_needs_nothing_the_policy_forbids() {
        assert!(!INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("<style"));
        assert!(!INDEX_HTML.contains(" style=") && !INDEX_HTML.contains(" onclick="));
        for file in [INDEX_HTML, APP_JS, CHART_JS, APP_CSS] {
            assert!(!file.contains("http://") && !file.contains("https://"), "no absolute URL");
        }
        assert!(INDEX_HTML.len() + APP_JS.len() + CHART_JS.len() + APP_CSS.len() < 60 << 10);
    }
}
