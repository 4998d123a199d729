//! The conversation's workspace files as MCP resources, read-only: `resources/list` names every
//! file (in pages), `resources/read` returns one.
//!
//! A file's URI is `file:///` and its workspace path, each segment percent-encoded where it is
//! not an unreserved character (the MCP specification's `file://` scheme, for resources that
//! behave like a file system whether or not they map to one). Listing or reading never creates
//! the conversation: an absent one lists no files and reads none. A file is returned whole, as
//! text when it is UTF-8 and as base64 otherwise, up to [`MAX_RESOURCE_BYTES`]; a larger one is
//! refused with advice to use the `read` tool, which pages through lines.

use base64::Engine;
use rmcp::model::{ListResourcesResult, ReadResourceResult, Resource, ResourceContents};
use sessionbox_core::{Error, Operation, Session};

use super::{Caller, Tools};

/// The URI prefix of a workspace file.
const SCHEME: &str = "file:///";
/// Files named in one `resources/list` page.
const PAGE: usize = 200;
/// Largest file `resources/read` returns, in bytes (1 MiB).
pub(super) const MAX_RESOURCE_BYTES: u64 = 1 << 20;

/// The URI of workspace path `path`.
fn uri_of(path: &str) -> String {
    let mut uri = String::from(SCHEME);
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            uri.push('/');
        }
        for b in segment.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                uri.push(char::from(b));
            } else {
                uri.push_str(&format!("%{b:02X}"));
            }
        }
    }
    uri
}

/// The workspace path a URI names.
///
/// # Errors
/// [`Error::InvalidRequest`] for another scheme, an empty path, or escapes that are not UTF-8.
fn path_of(uri: &str) -> Result<String, Error> {
    let bad = || {
        Error::InvalidRequest(format!(
            "a workspace resource is {SCHEME}PATH (as resources/list names it), not {uri:?}"
        ))
    };
    let raw = uri.strip_prefix(SCHEME).ok_or_else(bad)?;
    if raw.is_empty() {
        return Err(bad());
    }
    super::percent_decoded(raw).ok_or_else(bad)
}

/// A MIME type by file extension, for the few kinds a client shows differently; `None` leaves
/// the client to guess.
fn mime_of(path: &str) -> Option<&'static str> {
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "json" => "application/json",
        "html" | "htm" => "text/html",
        "csv" => "text/csv",
        "py" => "text/x-python",
        "rs" => "text/x-rust",
        "js" | "mjs" => "text/javascript",
        "ts" => "text/x-typescript",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        _ => return None,
    })
}

impl Tools {
    /// One page of the caller's workspace files, from `cursor` (the offset a previous page
    /// gave).
    pub(super) async fn list_files(
        &self,
        caller: &Caller,
        cursor: Option<&str>,
    ) -> Result<ListResourcesResult, Error> {
        let start = match cursor {
            None => 0,
            Some(c) => c.parse::<usize>().map_err(|_| {
                Error::InvalidRequest(format!("{c:?} is not a cursor this server gave"))
            })?,
        };
        let listed = self
            .state
            .with_conversation(&caller.conversation, Operation::Glob, async |opened| {
                opened.conv.glob("**/*").await
            })
            .await;
        let mut paths = match listed {
            Ok(Err(e)) if e.code() == "too_large" => {
                return Err(Error::InvalidRequest(format!(
                    "this workspace has too many files to list as resources ({e}); list a \
                     directory with the `ls` tool, and read a file as file:///PATH"
                )));
            }
            Ok(found) => found?,
            // Nothing is created to be listed: an absent conversation has no files.
            Err(e) if e.code() == "not_found" => Vec::new(),
            Err(e) => return Err(e),
        };
        paths.sort();
        let resources: Vec<Resource> = paths
            .iter()
            .skip(start)
            .take(PAGE)
            .map(|p| {
                let r = Resource::new(uri_of(p), p.clone());
                match mime_of(p) {
                    Some(m) => r.with_mime_type(m),
                    None => r,
                }
            })
            .collect();
        let mut result = ListResourcesResult::with_all_items(resources);
        result.next_cursor = (start + PAGE < paths.len()).then(|| (start + PAGE).to_string());
        Ok(result)
    }

    /// The file `uri` names, whole.
    pub(super) async fn read_file(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> Result<ReadResourceResult, Error> {
        let path = path_of(uri)?;
        let conv = &caller.conversation;
        self.state.manager.check_path(conv, &path)?;
        let bytes = self
            .state
            .with_conversation(conv, Operation::Read, async |opened| {
                let size = opened.conv.stat(&path).await?.size;
                // The file is in memory until it is sent: counted in the tenant's budget.
                let _held = self
                    .state
                    .budget
                    .reserve_body(&conv.tenant, usize::try_from(size).unwrap_or(usize::MAX))?;
                let too_large = |size: u64| Error::TooLarge {
                    what: format!(
                        "{path} ({size} bytes) as a resource; use the `read` tool, which pages \
                         through its lines"
                    ),
                    limit: MAX_RESOURCE_BYTES,
                };
                if size > MAX_RESOURCE_BYTES {
                    return Err(too_large(size));
                }
                // The file may have grown since: what was read is checked too.
                let bytes = opened.conv.read(&path).await?;
                if bytes.len() as u64 > MAX_RESOURCE_BYTES {
                    return Err(too_large(bytes.len() as u64));
                }
                Ok(bytes)
            })
            .await??;
        let contents = match String::from_utf8(bytes) {
            Ok(text) => ResourceContents::text(text, uri),
            Err(e) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                uri,
            ),
        };
        let contents = match mime_of(&path) {
            Some(m) => contents.with_mime_type(m),
            None => contents,
        };
        Ok(ReadResourceResult::new(vec![contents]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_round_trips_through_its_uri() {
        for path in [
            "a.txt",
            "dir/sub/file.rs",
            "sp ace/ü.md",
            "100%.txt",
            "a#b?c",
        ] {
            let uri = uri_of(path);
            assert!(uri.starts_with(SCHEME), "{uri}");
            assert!(!uri[SCHEME.len()..].contains([' ', '#', '?']), "{uri}");
            assert_eq!(path_of(&uri).unwrap(), path, "{uri}");
        }
        for bad in [
            "http://x/a",
            "file:///",
            "file://host/a",
            "a.txt",
            "file:///%FF",
        ] {
            assert_eq!(path_of(bad).unwrap_err().code(), "invalid_request", "{bad}");
        }
    }
}
