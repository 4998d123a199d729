//! The file, directory, metrics and error bodies of the execd API (see the parent module for
//! the rules they follow).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::null_as_default;

/// `type` of a [`FileInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else, including types this crate does not know.
    Other,
}

impl FileType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FileType::File => "file",
            FileType::Directory => "directory",
            FileType::Symlink => "symlink",
            FileType::Other => "other",
        }
    }
}

impl Serialize for FileType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FileType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match String::deserialize(d)?.as_str() {
            "file" => FileType::File,
            "directory" => FileType::Directory,
            "symlink" => FileType::Symlink,
            _ => FileType::Other,
        })
    }
}

/// File metadata (`FileInfo`), as returned by `/files/info`, `/files/search` and
/// `/directories/list`.
///
/// `mode` is the permission bits written as octal digits read as a decimal number: `755` means
/// `rwxr-xr-x` (upstream: `strconv.Atoi(strconv.FormatInt(perm, 8))`). Use [`mode_to_wire`] and
/// [`mode_from_wire`] to convert. The SDK requires every field but `type`; a server must send them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Absolute path.
    #[serde(default, deserialize_with = "null_as_default")]
    pub path: String,
    /// Entry type; older servers leave it out.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<FileType>,
    /// Size in bytes.
    #[serde(default, deserialize_with = "null_as_default")]
    pub size: u64,
    /// Last modification, RFC 3339.
    #[serde(default, deserialize_with = "null_as_default")]
    pub modified_at: String,
    /// Creation (upstream: change) time, RFC 3339.
    #[serde(default, deserialize_with = "null_as_default")]
    pub created_at: String,
    /// Owner user name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner: String,
    /// Group name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub group: String,
    /// Permission bits as octal digits (see the type's docs).
    #[serde(default, deserialize_with = "null_as_default")]
    pub mode: u32,
}

/// Writes permission bits the way execd does: `0o755` becomes `755`.
pub fn mode_to_wire(bits: u32) -> u32 {
    format!("{:o}", bits & 0o7777).parse().unwrap_or(0)
}

/// Reads execd's mode: `755` becomes `0o755`. `None` when a digit is 8 or 9.
pub fn mode_from_wire(mode: u32) -> Option<u32> {
    u32::from_str_radix(&mode.to_string(), 8).ok()
}

/// Ownership and mode for `POST /directories` and `POST /files/permissions` (`Permission`).
///
/// The SDK always sends `mode` (755 unless told otherwise) and sends `owner`/`group` only when set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    /// Owner user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Mode as octal digits (`755`).
    #[serde(default = "default_mode")]
    pub mode: u32,
}

fn default_mode() -> u32 {
    755
}

impl Default for Permission {
    fn default() -> Self {
        Permission {
            owner: None,
            group: None,
            mode: default_mode(),
        }
    }
}

impl Permission {
    /// Just a mode, given as octal digits (`755`).
    pub fn mode(mode: u32) -> Self {
        Permission {
            mode,
            ..Default::default()
        }
    }
}

/// The JSON of one upload metadata part (`FileMetadata`).
///
/// The SDK always writes all four keys, with `null` for an owner or group it was not given and
/// 755 as the default mode: `{"path": "/w/a.txt", "owner": null, "group": null, "mode": 755}`.
/// Serde writes the same keys compactly; [`crate::multipart::metadata_json`] writes them exactly
/// as the SDK does, and is what the client sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMetadata {
    /// Target path. Upstream expands `$NAME` in it, so a literal `$` fails there.
    #[serde(default, deserialize_with = "null_as_default")]
    pub path: String,
    /// Owner user name.
    #[serde(default)]
    pub owner: Option<String>,
    /// Group name.
    #[serde(default)]
    pub group: Option<String>,
    /// Mode as octal digits (`644`); `None` leaves the server's default.
    #[serde(default)]
    pub mode: Option<u32>,
}

impl FileMetadata {
    /// Metadata for `path` with the SDK's default mode 755.
    pub fn new(path: impl Into<String>) -> Self {
        FileMetadata {
            path: path.into(),
            owner: None,
            group: None,
            mode: Some(default_mode()),
        }
    }
}

/// One item of `POST /files/mv` (`RenameFileItem`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFileItem {
    /// Source path.
    pub src: String,
    /// Destination path; its directory must exist.
    pub dest: String,
}

/// One value of the `POST /files/replace` map (`ReplaceFileContentItem`): replace every `old`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceFileContentItem {
    /// Text to find; must not be empty.
    pub old: String,
    /// Replacement.
    pub new: String,
}

/// One value of the verbose `POST /files/replace` answer (`ReplaceFileContentResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceFileContentResult {
    /// Occurrences replaced (wire name `replacedCount`, camel case unlike everything else).
    #[serde(rename = "replacedCount")]
    pub replaced_count: u64,
}

/// Body of `GET /metrics` (`Metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// CPU cores.
    pub cpu_count: f64,
    /// CPU use in percent.
    pub cpu_used_pct: f64,
    /// Total memory in MiB.
    pub mem_total_mib: f64,
    /// Used memory in MiB.
    pub mem_used_mib: f64,
    /// When measured, Unix milliseconds.
    pub timestamp: i64,
}

/// Error body (`ErrorResponse`). Upstream's 401 uses `{"error": "..."}` instead, read into
/// `error`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// Machine-readable code, e.g. `FILE_NOT_FOUND`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub code: String,
    /// Human-readable message.
    #[serde(default, deserialize_with = "null_as_default")]
    pub message: String,
    /// The message of the access-token middleware's body; never serialized.
    #[serde(default, skip_serializing, deserialize_with = "null_as_default")]
    pub error: String,
}

impl ErrorResponse {
    /// A body with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorResponse {
            code: code.into(),
            message: message.into(),
            error: String::new(),
        }
    }
}

/// One file for `ExecdClient::upload` (feature `client`): where it goes and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadFile {
    /// The metadata part.
    pub metadata: FileMetadata,
    /// The file data.
    pub data: bytes::Bytes,
}

impl UploadFile {
    /// A file for `path` with the default mode 755, as the SDK's `write_file` sends it.
    pub fn new(path: impl Into<String>, data: impl Into<bytes::Bytes>) -> Self {
        UploadFile {
            metadata: FileMetadata::new(path),
            data: data.into(),
        }
    }

    /// Sets the mode (octal digits, `644`).
    pub fn mode(mut self, mode: u32) -> Self {
        self.metadata.mode = Some(mode);
        self
    }
}
