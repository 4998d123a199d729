//! Every path, header, query parameter and fixed string of the execd wire format, in one place.
//!
//! The client in this crate and the server in another crate both take these names from here, so
//! the two cannot drift apart. Sources: `execd-api.yaml` (spec 1.0.0) and, where they differ, the
//! released `opensandbox==1.1.1` Python SDK and the upstream daemon it talks to.

/// The port execd listens on inside an OpenSandbox sandbox (`DEFAULT_EXECD_PORT` in the SDK).
pub const DEFAULT_PORT: u16 = 44772;

/// Request header carrying the access token (`components.securitySchemes.AccessToken`).
///
/// Upstream answers a missing or wrong token with 401 and a body of the form
/// `{"error": "..."}`, not the usual `{"code", "message"}`.
pub const ACCESS_TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";

/// Response header of `GET /command/{id}/logs` with the next cursor. The YAML calls it a 0-based
/// line index; the released daemon (and sessionbox-agent) use the byte offset into the combined
/// output. Either way a client only passes it back.
pub const TAIL_CURSOR_HEADER: &str = "EXECD-COMMANDS-TAIL-CURSOR";

/// `GET`: health check; 200 with an empty body.
pub const PING: &str = "/ping";
/// `POST`: run a command, answered with an event stream. `DELETE ?id=`: interrupt it.
pub const COMMAND: &str = "/command";
/// `GET /command/status/{id}`: prefix of the command status path; see [`command_status_path`].
pub const COMMAND_STATUS_PREFIX: &str = "/command/status/";
/// `GET /command/{id}/logs?cursor=`: suffix of the background-log path; see [`command_logs_path`].
pub const COMMAND_LOGS_SUFFIX: &str = "/logs";
/// `GET ?path=...` (repeatable): map of path to file info.
pub const FILES_INFO: &str = "/files/info";
/// `DELETE ?path=...` (repeatable): remove files (not directories).
pub const FILES: &str = "/files";
/// `POST` a JSON array of `{src, dest}`.
pub const FILES_MOVE: &str = "/files/mv";
/// `POST` a JSON map of path to `{owner, group, mode}`.
pub const FILES_PERMISSIONS: &str = "/files/permissions";
/// `GET ?path=&pattern=`: glob search below a directory.
pub const FILES_SEARCH: &str = "/files/search";
/// `POST ?verbose=` a JSON map of path to `{old, new}`.
pub const FILES_REPLACE: &str = "/files/replace";
/// `POST` multipart: `metadata` and `file` parts, paired by order.
pub const FILES_UPLOAD: &str = "/files/upload";
/// `GET ?path=` (with optional `Range`, or `offset`/`limit` for line mode).
pub const FILES_DOWNLOAD: &str = "/files/download";
/// `GET ?path=&depth=`: list a directory.
pub const DIRECTORIES_LIST: &str = "/directories/list";
/// `POST` a JSON map of path to permission (mkdir -p). `DELETE ?path=...` (rm -rf).
pub const DIRECTORIES: &str = "/directories";
/// `GET`: a snapshot of CPU and memory use.
pub const METRICS: &str = "/metrics";

/// The agent's path for `rest` (no leading `/`) on `port` inside the sandbox, with `query`
/// as sent: upstream's reverse proxy, `/proxy/{port}/{rest}[?query]`.
pub fn proxy_path(port: u16, rest: &str, query: Option<&str>) -> String {
    match query {
        Some(q) => format!("/proxy/{port}/{rest}?{q}"),
        None => format!("/proxy/{port}/{rest}"),
    }
}

/// Query parameter names.
pub mod query {
    /// Command id for `DELETE /command` (the spec calls it a session id; it is the command id
    /// from the `init` event).
    pub const ID: &str = "id";
    /// Line cursor for `GET /command/{id}/logs`.
    pub const CURSOR: &str = "cursor";
    /// File or directory path; repeatable where the spec says so.
    pub const PATH: &str = "path";
    /// Glob pattern of `GET /files/search`; the SDK always sends it, `**` by default.
    pub const PATTERN: &str = "pattern";
    /// `true`/`false` on `POST /files/replace`; the SDK always sends it.
    pub const VERBOSE: &str = "verbose";
    /// Listing depth of `GET /directories/list`; 1 (immediate children) when absent.
    pub const DEPTH: &str = "depth";
    /// First line (1-based) of a line-mode download.
    pub const OFFSET: &str = "offset";
    /// Number of lines of a line-mode download.
    pub const LIMIT: &str = "limit";
}

/// Multipart names of `POST /files/upload`.
///
/// Upstream reads the form with Go's `MultipartForm`, which files a part under `File` only when it
/// has a `filename`; so the JSON metadata must be sent as a *file* part too. The SDK writes it as
/// `name="metadata"; filename="metadata"` with `Content-Type: application/json`, and the data as
/// `name="file"; filename="<base name of the target>"`. The server pairs the n-th metadata part
/// with the n-th file part.
pub mod upload {
    /// Form name of each metadata part.
    pub const METADATA_FIELD: &str = "metadata";
    /// File name given to each metadata part.
    pub const METADATA_FILENAME: &str = "metadata";
    /// Content type of each metadata part.
    pub const METADATA_CONTENT_TYPE: &str = "application/json";
    /// Form name of each data part.
    pub const FILE_FIELD: &str = "file";
    /// Content type of a data part given as bytes.
    pub const FILE_CONTENT_TYPE: &str = "application/octet-stream";
}

/// Error codes upstream puts in `ErrorResponse.code`.
pub mod error_code {
    /// Malformed body or failed validation (also used by upstream for an unknown command id).
    pub const INVALID_REQUEST_BODY: &str = "INVALID_REQUEST_BODY";
    /// A required query parameter is missing.
    pub const MISSING_QUERY: &str = "MISSING_QUERY";
    /// The operation failed inside the sandbox.
    pub const RUNTIME_ERROR: &str = "RUNTIME_ERROR";
    /// Upload form is malformed.
    pub const INVALID_FILE: &str = "INVALID_FILE";
    /// Upload data part is missing.
    pub const INVALID_FILE_CONTENT: &str = "INVALID_FILE_CONTENT";
    /// Upload metadata part is missing or malformed.
    pub const INVALID_FILE_METADATA: &str = "INVALID_FILE_METADATA";
    /// The file does not exist.
    pub const FILE_NOT_FOUND: &str = "FILE_NOT_FOUND";
    /// Anything else.
    pub const UNKNOWN: &str = "UNKNOWN";
    /// A code-interpreter context does not exist.
    pub const CONTEXT_NOT_FOUND: &str = "CONTEXT_NOT_FOUND";
    /// The operation is not supported here.
    pub const NOT_SUPPORTED: &str = "NOT_SUPPORTED";
}

/// `ename` upstream puts in the `error` event that ends a failed command. Its `evalue` is the
/// exit code as decimal text, or an error message when the command could not start.
pub const COMMAND_EXEC_ERROR: &str = "CommandExecError";

/// `ename` a sessionbox execd server puts in the terminal `error` event when it killed the command
/// because its `timeout` ran out. `evalue` is still the exit code, so the SDK reads it as usual.
/// Upstream gives no such marker: it kills the process group and reports exit code `-1`.
pub const COMMAND_TIMEOUT_ERROR: &str = "CommandTimeoutError";

/// Content type of the command event stream.
pub const EVENT_STREAM_CONTENT_TYPE: &str = "text/event-stream";

/// The separator upstream writes after each event: the stream is bare JSON objects, each
/// followed by one blank line (`{...}\n\n`), with no `data:` prefix.
pub const EVENT_SEPARATOR: &[u8] = b"\n\n";

/// `/command/status/{id}`, with `id` percent-encoded as one path segment.
pub fn command_status_path(id: &str) -> String {
    format!("{COMMAND_STATUS_PREFIX}{}", encode_segment(id))
}

/// `/command/{id}/logs`, with `id` percent-encoded as one path segment.
pub fn command_logs_path(id: &str) -> String {
    format!("{COMMAND}/{}{COMMAND_LOGS_SUFFIX}", encode_segment(id))
}

/// Percent-encodes everything but RFC 3986 unreserved characters, as the SDK does with
/// `quote(id, safe="")`.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_paths_encode_the_id_as_one_segment() {
        assert_eq!(command_status_path("abc-1"), "/command/status/abc-1");
        assert_eq!(command_logs_path("a/b c"), "/command/a%2Fb%20c/logs");
    }
}
