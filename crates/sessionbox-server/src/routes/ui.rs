//! `GET /ui/...`: the dashboard, static files built into the binary from
//! `crates/sessionbox-server/ui/` (so a fresh `cargo run -- serve` serves it, with nothing to
//! install), under a strict content security policy.
//!
//! The files need no key: they hold no data. The page asks for an API key, keeps it for the
//! browser session only (`sessionStorage`) and sends it on each API call like any client.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use include_dir::{Dir, include_dir};

use crate::error::ApiError;

/// The dashboard's files.
static UI: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/ui");

/// What a dashboard page may load and run: its own scripts, styles, images and fonts, the API
/// of this same origin (WebSockets included), blob: and data: images (previews of workspace
/// files); nothing inline, nothing from another address, never framed.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' blob: data:; font-src 'self'; connect-src 'self'; worker-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The MIME type of a dashboard file, by extension.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, e)| e) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("txt" | "md") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// `/ui`: to `/ui/`, so the page's relative links resolve beneath it.
pub(crate) async fn root() -> Response {
    Redirect::permanent("/ui/").into_response()
}

/// `/ui/` and `/ui/{*path}`: a dashboard file, or 404.
pub(crate) async fn file(request: Request) -> Response {
    let path = request
        .uri()
        .path()
        .strip_prefix("/ui/")
        .unwrap_or_default();
    let path = if path.is_empty() { "index.html" } else { path };
    // `include_dir` looks names up as given: `..` or an absolute path find nothing.
    let Some(found) = UI.get_file(path) else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such dashboard file")
            .into_response();
    };
    let mut response = found.contents().into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(path)),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_is_built_in_and_every_file_has_a_known_type() {
        assert!(
            UI.get_file("index.html").is_some(),
            "ui/index.html is embedded"
        );
        fn walk(dir: &Dir<'_>, out: &mut Vec<String>) {
            for f in dir.files() {
                out.push(f.path().to_string_lossy().into_owned());
            }
            for d in dir.dirs() {
                walk(d, out);
            }
        }
        let mut all = Vec::new();
        walk(&UI, &mut all);
        for path in all {
            let name = path.rsplit('/').next().unwrap_or_default();
            if name.starts_with("LICENSE") || name.starts_with('.') {
                continue;
            }
            assert_ne!(
                content_type(&path),
                "application/octet-stream",
                "{path}: add its type"
            );
        }
        assert!(UI.get_file("../Cargo.toml").is_none());
        assert!(UI.get_file("/index.html").is_none());
    }
}
