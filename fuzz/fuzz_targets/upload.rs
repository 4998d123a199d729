//! The multipart body of `POST /files/upload` (`sessionbox_execd::multipart`): what the agent
//! reads from whoever uploads, and what the client writes.
//!
//! Input: a mode byte. Mode even: `CONTENT_TYPE \x1f BODY`, read as the agent reads an upload.
//! Mode odd: files made from the input (`PATH \x1f OWNER \x1f DATA`, repeated), encoded as the
//! client encodes them (a fresh boundary, or one from the input that the data avoids), then
//! read back.
//! Properties:
//! - reading never panics; an accepted body has at least one file, each with its metadata;
//! - what the client writes, the agent reads back exactly: the same number of files, each
//!   file's bytes unchanged, each metadata part the JSON of its metadata, which parses back
//!   to the same metadata.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionbox_execd::multipart::{
    decode_upload, encode_upload, encode_upload_with_boundary, metadata_json, upload_boundary,
};
use sessionbox_execd::{FileMetadata, UploadFile};
use sessionbox_fuzz::{SEP, fields};

fn files(data: &[u8]) -> Option<Vec<UploadFile>> {
    let mut out = Vec::new();
    let parts: Vec<&[u8]> = data.split(|b| *b == SEP).collect();
    for f in parts.chunks(3) {
        let path = std::str::from_utf8(f[0]).ok()?;
        let mut file = UploadFile::new(path, f.get(2).copied().unwrap_or_default().to_vec());
        if let Some(owner) = f.get(1).filter(|o| !o.is_empty()) {
            file.metadata.owner = Some(std::str::from_utf8(owner).ok()?.to_owned());
            file.metadata.mode = Some(u32::from(owner[0]) * 3);
        }
        out.push(file);
    }
    Some(out)
}

fn round_trip(files: &[UploadFile], boundary: &str, body: Vec<u8>) {
    let parts = decode_upload(boundary, body.into())
        .unwrap_or_else(|e| panic!("our own body is refused: {e} (boundary {boundary:?})"));
    assert_eq!(parts.len(), files.len());
    for (p, f) in parts.iter().zip(files) {
        assert_eq!(p.data, f.data, "{:?}", f.metadata.path);
        assert_eq!(p.metadata, metadata_json(&f.metadata).as_bytes());
        let back: FileMetadata = serde_json::from_slice(&p.metadata).expect("metadata is JSON");
        assert_eq!(back, f.metadata);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let f = fields(rest, 2);
        let Ok(content_type) = std::str::from_utf8(f[0]) else {
            return;
        };
        let Ok(boundary) = upload_boundary(content_type) else {
            return;
        };
        if let Ok(parts) = decode_upload(&boundary, f[1].to_vec().into()) {
            assert!(!parts.is_empty());
        }
        return;
    }
    let Some(files) = files(rest) else { return };
    let body = encode_upload(&files);
    let boundary = upload_boundary(&body.content_type()).expect("our own content type");
    assert_eq!(boundary, body.boundary);
    round_trip(&files, &boundary, body.body);
    // A boundary chosen by the input, when the files avoid it as encode_upload's do.
    let chosen: String = files[0]
        .metadata
        .path
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(70)
        .collect();
    let clash = files.iter().any(|f| {
        f.data
            .windows(chosen.len().max(1))
            .any(|w| w == chosen.as_bytes())
            || f.metadata.path.contains(&chosen)
            || f.metadata
                .owner
                .as_deref()
                .is_some_and(|o| o.contains(&chosen))
    });
    if !chosen.is_empty() && !clash {
        round_trip(
            &files,
            &chosen,
            encode_upload_with_boundary(&files, &chosen),
        );
    }
});
