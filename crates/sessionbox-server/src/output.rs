//! Command output on the wire: bytes as JSON text, with the exact bytes in base64 when they are
//! not valid UTF-8, and chunk boundaries kept off the middle of a character.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;

/// A piece of output as the API sends it: `text` always (invalid UTF-8 replaced by U+FFFD),
/// `base64` only when the bytes were not valid UTF-8 (then it holds them exactly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct OutputText {
    /// The bytes as text.
    pub text: String,
    /// The exact bytes, base64 (standard alphabet, padded), present only when they are not
    /// valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

impl OutputText {
    /// `bytes` as text, with base64 when they are not valid UTF-8; valid UTF-8 is taken as
    /// it is, without a copy (an exec's answer holds up to 16 MiB of each stream).
    pub(crate) fn from_vec(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => OutputText { text, base64: None },
            Err(e) => OutputText::of(e.as_bytes()),
        }
    }

    /// `bytes` as text, with base64 when they are not valid UTF-8.
    pub(crate) fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(s) => OutputText {
                text: s.to_owned(),
                base64: None,
            },
            Err(_) => OutputText {
                text: String::from_utf8_lossy(bytes).into_owned(),
                base64: Some(BASE64.encode(bytes)),
            },
        }
    }
}

/// How many bytes at the end of `bytes` are the start of a UTF-8 character that is not
/// complete yet (0 to 3). Invalid bytes elsewhere do not count: they are sent as they are.
pub(crate) fn incomplete_tail(bytes: &[u8]) -> usize {
    // A loop, not recursion: random bytes hold an invalid sequence every few bytes, and one
    // stack frame per sequence overflowed the stack on 64 KiB of them.
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(e) => match e.error_len() {
                None => return rest.len() - e.valid_up_to(),
                // Invalid bytes inside; look at what follows them.
                Some(n) => rest = &rest[e.valid_up_to() + n..],
            },
        }
    }
}

/// Splits a stream into chunks that never end inside a character: up to three bytes of an
/// incomplete character are held back until the next chunk (or [`Utf8Chunker::finish`]).
#[derive(Debug, Default)]
pub(crate) struct Utf8Chunker {
    held: Vec<u8>,
}

impl Utf8Chunker {
    /// The next chunk to send for `bytes` (with what was held before), or `None` when all of it
    /// is held back.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Option<OutputText> {
        self.held.extend_from_slice(bytes);
        let keep = incomplete_tail(&self.held);
        let send = self.held.len() - keep;
        if send == 0 {
            return None;
        }
        let out = OutputText::of(&self.held[..send]);
        self.held.drain(..send);
        Some(out)
    }

    /// Whatever is still held (an incomplete character at the very end of the output).
    pub(crate) fn finish(&mut self) -> Option<OutputText> {
        if self.held.is_empty() {
            return None;
        }
        let out = OutputText::of(&self.held);
        self.held.clear();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_chunks_is_sent_whole() {
        let euro = "€".as_bytes(); // 3 bytes
        let mut c = Utf8Chunker::default();
        let a = c.push(&[b'a', euro[0]]).unwrap();
        assert_eq!(a.text, "a");
        assert!(c.push(&euro[1..2]).is_none());
        let b = c.push(&[euro[2], b'b']).unwrap();
        assert_eq!((b.text.as_str(), b.base64), ("€b", None));
        assert!(c.finish().is_none());
    }

    #[test]
    fn invalid_bytes_are_sent_with_base64_and_a_dangling_tail_at_the_end() {
        let mut c = Utf8Chunker::default();
        let x = c.push(&[0xff, b'x', 0xe2]).unwrap();
        assert_eq!(x.text, "\u{fffd}x");
        assert_eq!(x.base64.as_deref(), Some("/3g="));
        let end = c.finish().unwrap();
        assert_eq!(end.base64.as_deref(), Some("4g=="));
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail(&[0xf0, 0x9f]), 2);
        // Many invalid sequences (random bytes): no recursion, the right tail.
        let mut many = [0xffu8, b'a'].repeat(1 << 20);
        many.extend_from_slice(&[0xe2, 0x82]);
        assert_eq!(incomplete_tail(&many), 2);
    }
}
