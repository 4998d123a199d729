//! Upstream execd's line framing of command output, for clients that did not ask for exact
//! bytes.
//!
//! The rules, as upstream execd applies them to each of stdout and stderr on its own (read
//! from its `runtime` package; see the crate README):
//!
//! - `\n`, `\r` and the pair `\r\n` each end a line; a line is sent **without** its terminator.
//! - A terminator that ends an empty line sends the text `"\n"` (so `printf 'a\n\nb\n'` is
//!   `"a"`, `"\n"`, `"b"`), except the `\n` of a `\r\n` pair, which is swallowed, also when
//!   the pair is split between two reads.
//! - A line without its terminator yet is held until the terminator arrives or the command
//!   ends; then it is sent as it is.
//! - Text is never empty; bytes that are not UTF-8 become U+FFFD (a character is never split,
//!   because only whole lines are decoded).
//!
//! Unlike upstream, a held line cannot grow without bound: the agent caps what it forwards of
//! each stream, so a line is at most that cap.

/// Splits one output stream into upstream's line events.
#[derive(Debug, Default)]
pub(crate) struct LineFramer {
    /// The current line, not terminated yet.
    line: Vec<u8>,
    /// The last byte read was a `\r`: a `\n` right after it completes the pair.
    after_cr: bool,
}

impl LineFramer {
    /// Takes the next bytes of the stream; returns the texts of the lines they complete.
    pub(crate) fn push(&mut self, data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in data {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    out.push(self.take_line());
                }
                _ => {
                    self.after_cr = false;
                    self.line.push(b);
                }
            }
        }
        out
    }

    /// The end of the stream: the held line, if any.
    pub(crate) fn finish(&mut self) -> Option<String> {
        self.after_cr = false;
        if self.line.is_empty() {
            None
        } else {
            Some(self.take_line())
        }
    }

    fn take_line(&mut self) -> String {
        if self.line.is_empty() {
            return "\n".to_owned();
        }
        let text = String::from_utf8_lossy(&self.line).into_owned();
        self.line.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(chunks: &[&[u8]]) -> Vec<String> {
        let mut f = LineFramer::default();
        let mut out: Vec<String> = chunks.iter().flat_map(|c| f.push(c)).collect();
        out.extend(f.finish());
        out
    }

    #[test]
    fn lines_as_upstream_sends_them() {
        let cases: &[(&[u8], &[&str])] = &[
            (b"a\n\nb\n", &["a", "\n", "b"]),
            (b"x", &["x"]),
            (b"a\nb", &["a", "b"]),
            (b"a\r\nb\r\n", &["a", "b"]),
            (b"10%\r20%\r", &["10%", "20%"]),
            (b"a\r\rb\n", &["a", "\n", "b"]),
            (b"a\n\rb\n", &["a", "\n", "b"]),
            (b"\n", &["\n"]),
            (b"", &[]),
            (b"a\xffb\n", &["a\u{fffd}b"]),
        ];
        for (input, want) in cases {
            assert_eq!(
                frame(&[input]),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn the_same_lines_whatever_the_reads() {
        let input = "é\r\n€\n\n😀 z\r\rend".as_bytes();
        let whole = frame(&[input]);
        assert_eq!(whole, ["é", "€", "\n", "😀 z", "\n", "end"]);
        for cut in 0..=input.len() {
            let (a, b) = input.split_at(cut);
            assert_eq!(frame(&[a, b]), whole, "cut at {cut}");
        }
    }
}
