//! File operations: their requests, results and limits.

use serde::{Deserialize, Serialize};

/// What kind of file a path names (links are not followed when listing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// Anything else (FIFO, socket, device).
    Other,
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// The path as the runtime presents it (for example `/workspace/a.txt`).
    pub path: String,
    /// Its kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`). Serialized as octal text (`"0644"`), as `ls` and
    /// `chmod` write them; read back from that or from a number.
    #[serde(with = "octal_mode")]
    pub mode: u32,
    /// Last modification, in seconds since the Unix epoch.
    pub modified_unix: i64,
}

/// [`FileStat::mode`] as octal text: at least four digits (`"0644"`, `"4755"`).
mod octal_mode {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(mode: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{mode:04o}"))
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Mode {
        Text(String),
        Number(u32),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        match Mode::deserialize(d)? {
            Mode::Number(n) => Ok(n),
            Mode::Text(t) => u32::from_str_radix(&t, 8).map_err(|_| {
                serde::de::Error::custom(format!("mode {t:?} is not an octal number"))
            }),
        }
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry's name (lossy UTF-8).
    pub name: String,
    /// Its kind, without following links.
    pub kind: FileKind,
    /// Size in bytes (of the link itself for links).
    pub size: u64,
    /// Last modification, in seconds since the Unix epoch.
    pub modified_unix: i64,
}

/// Replace an exact string in a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditRequest {
    /// The text to find; must not be empty.
    pub old: String,
    /// Its replacement.
    pub new: String,
    /// Replace every occurrence. Without it, `old` must occur exactly once.
    #[serde(default)]
    pub replace_all: bool,
}

/// What an edit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditResult {
    /// How many occurrences were replaced.
    pub replacements: usize,
}

/// Search file contents with a regular expression (Rust `regex` syntax), line by line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepRequest {
    /// The regular expression.
    pub pattern: String,
    /// File or directory to search, a workspace path; `None` is the whole workspace.
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose workspace-relative path matches this glob (for example `**/*.rs`).
    #[serde(default)]
    pub glob: Option<String>,
    /// Match case-insensitively.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Stop after this many matches; `None` is [`Limits::max_matches`].
    #[serde(default)]
    pub max_matches: Option<usize>,
}

impl GrepRequest {
    /// A search for `pattern` in the whole workspace.
    pub fn new(pattern: impl Into<String>) -> Self {
        GrepRequest {
            pattern: pattern.into(),
            path: None,
            glob: None,
            case_insensitive: false,
            max_matches: None,
        }
    }
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    /// The file, relative to the workspace root.
    pub path: String,
    /// 1-based line number.
    pub line_number: u64,
    /// The line without its newline, lossy UTF-8, cut to 4 KiB.
    pub line: String,
}

/// Limits on file operations. Defaults are what an agent's tools need; runtimes take them from
/// configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest file `read`, `write` or `edit` handles, in bytes (default 64 MiB).
    pub max_file_bytes: u64,
    /// Most entries `list` and `glob` return (default 10 000).
    pub max_entries: usize,
    /// Most matches `grep` returns (default 1 000).
    pub max_matches: usize,
    /// Largest file `grep` searches, in bytes; larger ones are skipped (default 8 MiB).
    pub max_grep_file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 64 * 1024 * 1024,
            max_entries: 10_000,
            max_matches: 1_000,
            max_grep_file_bytes: 8 * 1024 * 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_shows_its_mode_in_octal_and_reads_it_back() {
        let st = FileStat {
            path: "/workspace/a".into(),
            kind: FileKind::File,
            size: 1,
            mode: 0o644,
            modified_unix: 0,
        };
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(v["mode"], "0644");
        assert_eq!(serde_json::from_value::<FileStat>(v.clone()).unwrap(), st);
        let mut v = v;
        v["mode"] = 420.into();
        assert_eq!(
            serde_json::from_value::<FileStat>(v.clone()).unwrap().mode,
            0o644
        );
        v["mode"] = "0x1".into();
        assert!(serde_json::from_value::<FileStat>(v).is_err());
    }
}
