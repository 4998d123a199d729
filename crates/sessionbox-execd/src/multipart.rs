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
//!
//! The server side reads such a body with [`upload_boundary`] and [`decode_upload`]: the parts
//! named `metadata` and `file`, paired by order, each pair one file to write.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::types::{FileMetadata, UploadFile};
use crate::wire::{error_code, upload};

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
/// `_multipart_header_filename(os.path.basename(path) or "file")`). Other control characters
/// are replaced by `_` too, where the SDK keeps them: a header may not hold them (RFC 9110), so
/// a server's parser refuses the whole body (ours does), and the server reads the path from
/// the metadata anyway.
pub fn header_filename(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or("");
    let base = if base.is_empty() { "file" } else { base };
    let mut out = String::with_capacity(base.len());
    for c in base.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if c.is_control() => out.push('_'),
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

/// Why an upload body was refused: the execd error code ([`error_code`]) and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct UploadError {
    /// [`error_code::INVALID_FILE`], [`error_code::INVALID_FILE_METADATA`] or
    /// [`error_code::INVALID_FILE_CONTENT`].
    pub code: &'static str,
    /// What is wrong, for the caller.
    pub message: String,
}

/// One file of an upload: its `metadata` part (JSON, not yet parsed) and its `file` part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPart {
    /// The bytes of the n-th `metadata` part.
    pub metadata: Bytes,
    /// The bytes of the n-th `file` part.
    pub data: Bytes,
}

/// The boundary of an upload's `Content-Type` (`multipart/form-data; boundary=...`).
///
/// # Errors
/// [`error_code::INVALID_FILE`] when it is not multipart or names no boundary.
pub fn upload_boundary(content_type: &str) -> Result<String, UploadError> {
    multer::parse_boundary(content_type).map_err(|e| UploadError {
        code: error_code::INVALID_FILE,
        message: format!("the upload must be multipart/form-data with a boundary: {e}"),
    })
}

/// Reads a whole upload body: the n-th `metadata` part paired with the n-th `file` part (parts
/// of other names are skipped), as upstream's server pairs them. At least one pair, and as many
/// of one as of the other.
///
/// ```
/// use sessionbox_execd::UploadFile;
/// use sessionbox_execd::multipart::{decode_upload, encode_upload, metadata_json, upload_boundary};
/// let files = [UploadFile::new("/w/a.txt", &b"hello"[..])];
/// let body = encode_upload(&files);
/// let boundary = upload_boundary(&body.content_type()).unwrap();
/// let parts = decode_upload(&boundary, body.body.into()).unwrap();
/// assert_eq!(parts[0].data, &b"hello"[..]);
/// assert_eq!(parts[0].metadata, metadata_json(&files[0].metadata).as_bytes());
/// ```
///
/// # Errors
/// [`UploadError`] with upstream's code: a malformed form ([`error_code::INVALID_FILE`]), no
/// metadata part, no file part, or counts that differ.
pub fn decode_upload(boundary: &str, body: Bytes) -> Result<Vec<UploadPart>, UploadError> {
    let bad = |code: &'static str, message: String| UploadError { code, message };
    let (metadata, files) = read_parts(boundary, body)?;
    if metadata.is_empty() {
        return Err(bad(
            error_code::INVALID_FILE_METADATA,
            "metadata file is missing".into(),
        ));
    }
    if files.is_empty() {
        return Err(bad(
            error_code::INVALID_FILE_CONTENT,
            "file is missing".into(),
        ));
    }
    if metadata.len() != files.len() {
        return Err(bad(
            error_code::INVALID_FILE,
            format!(
                "metadata and file count mismatch: {} vs {}",
                metadata.len(),
                files.len()
            ),
        ));
    }
    Ok(metadata
        .into_iter()
        .zip(files)
        .map(|(metadata, data)| UploadPart { metadata, data })
        .collect())
}

/// The `metadata` parts and the `file` parts of a whole body, in order. The body is all in
/// memory, so the parser never waits: it is polled to completion here, with no executor.
fn read_parts(boundary: &str, body: Bytes) -> Result<(Vec<Bytes>, Vec<Bytes>), UploadError> {
    let malformed = |message: String| UploadError {
        code: error_code::INVALID_FILE,
        message,
    };
    let stream = futures::stream::once(std::future::ready(Ok::<Bytes, std::convert::Infallible>(
        body,
    )));
    let mut form = multer::Multipart::new(stream, boundary);
    let read = async move {
        let mut metadata = Vec::new();
        let mut files = Vec::new();
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| malformed(format!("malformed multipart form: {e}")))?
        {
            let name = field.name().unwrap_or("").to_owned();
            let data = field
                .bytes()
                .await
                .map_err(|e| malformed(format!("malformed multipart part {name:?}: {e}")))?;
            if name == upload::METADATA_FIELD {
                metadata.push(data);
            } else if name == upload::FILE_FIELD {
                files.push(data);
            }
        }
        Ok((metadata, files))
    };
    let mut read = std::pin::pin!(read);
    match read
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(r) => r,
        // Only a stream that is not ready makes the parser wait, and this one always is.
        std::task::Poll::Pending => Err(malformed(
            "the multipart parser waited for more of a body that was all there".into(),
        )),
    }
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

    /// Found by the `upload` fuzz target: a file whose name holds a control character other
    /// than CR or LF made a body our own reader refused (a header may not hold one).
    #[test]
    fn names_with_control_characters_make_a_body_that_reads_back() {
        assert_eq!(header_filename("/w/a\tb\u{7f}c\u{1}d\u{85}"), "a_b_c_d_");
        let files = [
            UploadFile::new("/w/é\u{1F600}\t\u{7f}\"\\", &b"--BND\r\n"[..]),
            UploadFile::new("/w/\u{1}\u{1b}[31m", &b"x"[..]),
        ];
        let body = encode_upload(&files);
        let parts = decode_upload(&body.boundary, body.body.into()).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].data, &b"--BND\r\n"[..]);
        assert_eq!(
            parts[1].metadata,
            metadata_json(&files[1].metadata).as_bytes()
        );
    }

    #[test]
    fn bodies_that_break_the_pairing_are_refused_with_upstreams_codes() {
        let one = encode_upload_with_boundary(&[UploadFile::new("/w/a", &b"a"[..])], "B");
        let text = String::from_utf8(one).unwrap();
        let only_metadata = text.replace("name=\"file\"", "name=\"other\"");
        let err = decode_upload("B", only_metadata.into()).unwrap_err();
        assert_eq!(err.code, error_code::INVALID_FILE_CONTENT);
        let only_file = text.replace("name=\"metadata\"", "name=\"other\"");
        let err = decode_upload("B", only_file.into()).unwrap_err();
        assert_eq!(err.code, error_code::INVALID_FILE_METADATA);
        let err = decode_upload("B", text[..text.len() / 2].to_owned().into()).unwrap_err();
        assert_eq!(err.code, error_code::INVALID_FILE);
        assert_eq!(
            upload_boundary("text/plain").unwrap_err().code,
            error_code::INVALID_FILE
        );
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
