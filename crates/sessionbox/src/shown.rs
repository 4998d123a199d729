//! Workspace names as printed: a name is whatever the conversation's commands made it, so one
//! holding ESC, CR or BEL could rewrite the user's terminal. On a terminal, [`Names`] escapes
//! them visibly (as `ls -b` does); to a pipe or a file it writes the exact bytes.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::IsTerminal;

/// How this process prints workspace names on stdout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    escape: bool,
}

impl Names {
    /// Escaping when stdout is a terminal, exact bytes otherwise.
    pub(crate) fn for_stdout() -> Self {
        Names {
            escape: std::io::stdout().is_terminal(),
        }
    }

    /// `name` as it is printed.
    pub(crate) fn show<'a>(&self, name: &'a str) -> Cow<'a, str> {
        if self.escape {
            escaped(name.as_bytes())
        } else {
            Cow::Borrowed(name)
        }
    }
}

/// `name` with every control character (C0, DEL, C1), every byte that is not UTF-8 and every
/// backslash written visibly: `\n`, `\r`, `\t`, `\\`, `\x1b` (a byte), `\u{85}` (a C1
/// character). Any other name comes back unchanged.
pub(crate) fn escaped(name: &[u8]) -> Cow<'_, str> {
    let plain = |c: char| !c.is_control() && c != '\\';
    if let Ok(s) = std::str::from_utf8(name)
        && s.chars().all(plain)
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\\' => out.push_str("\\\\"),
                c if c.is_ascii_control() => {
                    let _ = write!(out, "\\x{:02x}", u32::from(c));
                }
                c if c.is_control() => {
                    let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_bytes_that_are_not_utf8_are_escaped_visibly() {
        assert_eq!(escaped(b"\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(escaped(b"a\nb\rc\td\x7f"), "a\\nb\\rc\\td\\x7f");
        assert_eq!(escaped(b"\0"), "\\x00");
        // C1 controls (U+0080 to U+009F), e.g. CSI U+009B.
        assert_eq!(escaped("x\u{9b}31m".as_bytes()), "x\\u{9b}31m");
        assert_eq!(escaped(b"bad\xff\xfe.txt"), "bad\\xff\\xfe.txt");
        // A backslash is escaped too, so an escaped name cannot pass for another.
        assert_eq!(escaped(b"a\\x1b"), "a\\\\x1b");
    }

    #[test]
    fn ordinary_names_are_unchanged() {
        for name in [
            "notes.txt",
            "src/main.rs",
            "résumé ünïcode 日本語 🎉",
            "a b",
            "",
        ] {
            assert!(matches!(escaped(name.as_bytes()), Cow::Borrowed(s) if s == name));
        }
        let exact = Names { escape: false };
        assert_eq!(exact.show("\x1b[2J"), "\x1b[2J");
        let terminal = Names { escape: true };
        assert_eq!(terminal.show("\x1b[2J"), "\\x1b[2J");
    }
}
