//! The multipart body of `POST /files/upload`, written the way the SDK writes it.
//!
//! For each file, in order (SDK `FilesystemAdapter._write_files_chunked`):
//!
//! ```text
//! --BOUNDARY\r\n
//! Content-Disposition: form-data; name="metadata"; filename="metadata"\r\n
//! Content-Type: application/json\r\n
//! \r\n
//! {"path": "/w/a.txt", "owner": null, "group": null, "mode": 755}\r\n
//! --BOUNDARY\r\n
//! Content-Disposition: form-data; name="file"; filename="a.txt"\r\n
//! Content-Type: application/octet-stream\r\n
//! \r\n
//! <bytes>\r\n
//! ```
//!
//! then `--BOUNDARY--\r\n`. The metadata JSON is written as Python's `json.dumps` writes it
//! (`", "` and `": "` separators, non-ASCII as `\uXXXX`), so the body is byte for byte what the
//! SDK sends apart from the boundary. The SDK streams it chunked when it talks to execd directly
//! and with a `Content-Length` through the server proxy; we always send a `Content-Length`. The metadata goes in a *file* part (with a `filename`) because
//! upstream's Go `MultipartForm` lists only parts with a file name under `File`; the server pairs
//! the n-th `metadata` part with the n-th `file` part. The data part's file name is the target's
//! base name, escaped as the SDK escapes it; the server ignores it and uses the metadata path.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::{FileMetadata, UploadFile};
use crate::wire::upload;

/// An encoded upload body and its `Content-Type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipartBody {
    /// The boundary, without the leading dashes.
    pub boundary: String,
    /// The whole body.
    pub body: Vec<u8>,
}

impl MultipartBody {
    /// `multipart/form-data; boundary=...`.
    pub fn content_type(&self) -> String {
        format!("multipart/form-data; boundary={}", self.boundary)
    }
}

/// Encodes `files` with a fresh boundary that occurs in none of them.
pub fn encode_upload(files: &[UploadFile]) -> MultipartBody {
    loop {
        let boundary = fresh_boundary();
        let clashes = files.iter().any(|f| {
            contains(&f.data, boundary.as_bytes()) || f.metadata.path.contains(boundary.as_str())
        });
        if !clashes {
            let body = encode_upload_with_boundary(files, &boundary);
            return MultipartBody { boundary, body };
        }
    }
}

/// Encodes `files` with the given boundary (which must not occur in the data).
pub fn encode_upload_with_boundary(files: &[UploadFile], boundary: &str) -> Vec<u8> {
    let size: usize = files.iter().map(|f| f.data.len() + 512).sum();
    let mut out = Vec::with_capacity(size + 64);
    for f in files {
        let metadata = metadata_json(&f.metadata);
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        out.extend_from_slice(
            format!(
                "Content-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\n",
                upload::METADATA_FIELD,
                upload::METADATA_FILENAME
            )
            .as_bytes(),
        );
        out.extend_from_slice(
            format!("Content-Type: {}\r\n\r\n", upload::METADATA_CONTENT_TYPE).as_bytes(),
        );
        out.extend_from_slice(metadata.as_bytes());
        out.extend_from_slice(b"\r\n");

        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        out.extend_from_slice(
            format!(
                "Content-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\n",
                upload::FILE_FIELD,
                header_filename(&f.metadata.path)
            )
            .as_bytes(),
        );
        out.extend_from_slice(
            format!("Content-Type: {}\r\n\r\n", upload::FILE_CONTENT_TYPE).as_bytes(),
        );
        out.extend_from_slice(&f.data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

/// The base name of `path` for a `filename="..."` parameter: `\` and `"` escaped with a
/// backslash, CR and LF replaced by `_`, `file` when the base name is empty (SDK
/// `_multipart_header_filename(os.path.basename(path) or "file")`).
pub fn header_filename(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or("");
    let base = if base.is_empty() { "file" } else { base };
    let mut out = String::with_capacity(base.len());
    for c in base.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\r' | '\n' => out.push('_'),
            c => out.push(c),
        }
    }
    out
}

/// `json.dumps({"path": ..., "owner": ..., "group": ..., "mode": ...})` as Python writes it.
pub fn metadata_json(m: &FileMetadata) -> String {
    fn opt_str(s: &Option<String>) -> String {
        s.as_deref()
            .map_or_else(|| "null".to_owned(), python_json_string)
    }
    format!(
        "{{\"path\": {}, \"owner\": {}, \"group\": {}, \"mode\": {}}}",
        python_json_string(&m.path),
        opt_str(&m.owner),
        opt_str(&m.group),
        m.mode.map_or_else(|| "null".to_owned(), |v| v.to_string()),
    )
}

/// A JSON string as Python's `json.dumps` (with `ensure_ascii=True`) writes it.
fn python_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

fn fresh_boundary() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut h = RandomState::new().build_hasher();
    h.write_u128(now.as_nanos());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("sessionbox_{:016x}_{}", h.finish(), now.as_secs())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_matches_the_sdk_layout() {
        let files = [
            UploadFile::new("/w/dir/a.txt", &b"hello"[..]),
            UploadFile::new("/w/b\".bin", vec![0u8, 255, 13, 10]).mode(644),
        ];
        let body = encode_upload_with_boundary(&files, "BND");
        let expected = concat!(
            "--BND\r\n",
            "Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n",
            "Content-Type: application/json\r\n\r\n",
            "{\"path\": \"/w/dir/a.txt\", \"owner\": null, \"group\": null, \"mode\": 755}\r\n",
            "--BND\r\n",
            "Content-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n",
            "Content-Type: application/octet-stream\r\n\r\n",
            "hello\r\n",
            "--BND\r\n",
            "Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n",
            "Content-Type: application/json\r\n\r\n",
            "{\"path\": \"/w/b\\\".bin\", \"owner\": null, \"group\": null, \"mode\": 644}\r\n",
            "--BND\r\n",
            "Content-Disposition: form-data; name=\"file\"; filename=\"b\\\".bin\"\r\n",
            "Content-Type: application/octet-stream\r\n\r\n",
        );
        let mut want = expected.as_bytes().to_vec();
        want.extend_from_slice(&[0, 255, 13, 10]);
        want.extend_from_slice(b"\r\n--BND--\r\n");
        assert_eq!(
            String::from_utf8_lossy(&body),
            String::from_utf8_lossy(&want)
        );
        assert_eq!(body, want);
    }

    #[test]
    fn metadata_is_written_like_python_json_dumps() {
        let mut m = FileMetadata::new("/w/é\u{1F600}\t\u{7f}\"\\");
        m.owner = Some("root".into());
        assert_eq!(
            metadata_json(&m),
            r#"{"path": "/w/\u00e9\ud83d\ude00\t\u007f\"\\", "owner": "root", "group": null, "mode": 755}"#
        );
        // It is JSON all the same.
        let back: FileMetadata = serde_json::from_str(&metadata_json(&m)).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn filenames_are_escaped_like_the_sdk() {
        assert_eq!(header_filename("/a/b\\c\"d\r\ne"), "b\\\\c\\\"d__e");
        assert_eq!(header_filename("/a/"), "file");
        assert_eq!(header_filename("plain"), "plain");
    }

    #[test]
    fn boundary_avoids_the_data() {
        let b = encode_upload(&[UploadFile::new("/x", &b"abc"[..])]);
        assert!(b.boundary.starts_with("sessionbox_"));
        assert!(b.content_type().ends_with(&b.boundary));
        assert!(
            b.body
                .ends_with(format!("--{}--\r\n", b.boundary).as_bytes())
        );
        assert_ne!(fresh_boundary(), fresh_boundary());
    }
}
