//! Checking an archive against the snapshot rules and rewriting it in the canonical form, as
//! streams: the caller opens the reader and the writer (this crate opens nothing itself).
//!
//! The canonical form is what every runtime writes: ustar headers (a PAX extended header
//! before an entry whose name, link target or size does not fit), paths relative to the root
//! with no `.` or `..` component, directories named with a trailing `/`, only the three kinds,
//! permission bits without set-id bits (`mode & 0o1777`; links `0o777`), owners `0`/empty,
//! modification times kept, and the end-of-archive marker. A reader that checks a rewritten
//! archive again finds the same entries and the same [`ArchiveStats`].
//!
//! Rewriting what a caller gives before anyone else reads it also means that whatever
//! extracts it later (GNU tar in a container, say) sees only this form, never the
//! extensions a hostile archive could use to make two tar readers disagree.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Read, Write};

use sessionbox_core::{ArchiveStats, Error, MAX_ARCHIVE_ENTRIES};

/// Longest path, in bytes, an archive entry may have (Linux's `PATH_MAX` less its NUL).
pub const MAX_ARCHIVE_PATH_BYTES: usize = 4095;

/// Longest component of an entry's path, in bytes (Linux's `NAME_MAX`).
pub const MAX_ARCHIVE_NAME_BYTES: usize = 255;

/// Where an archive comes from, which decides what happens to an entry that breaks a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveSource {
    /// A runtime's own tar of a workspace (GNU tar's output, say): a leading `./` and the
    /// root's own entry are dropped, entries of other kinds (fifos, devices) are skipped and
    /// counted in [`ArchiveStats::skipped`], and more than [`MAX_ARCHIVE_ENTRIES`] entries is
    /// [`Error::TooLarge`]. A hard link, or a path that breaks a rule, is still an error:
    /// [`Error::InvalidRequest`], which the runtime should report as its own failure.
    Workspace,
    /// An archive a caller gives to restore: every rule is enforced and the first entry that
    /// breaks one refuses the whole archive with [`Error::InvalidRequest`] (a leading `./` and
    /// the root's own entry are accepted and dropped, as GNU tar writes them).
    Restore,
}

/// Checks an archive to restore against every snapshot rule without writing anything, and
/// counts what it holds.
///
/// ```
/// use sessionbox_archive::check_archive;
/// // An empty archive: the end-of-archive marker alone.
/// let stats = check_archive(&[0u8; 1024][..]).unwrap();
/// assert_eq!(stats.entries(), 0);
/// assert_eq!(check_archive(&b"not a tar"[..]).unwrap_err().code(), "invalid_request");
/// ```
///
/// # Errors
/// [`Error::InvalidRequest`] naming the first entry that breaks a rule (or saying that the
/// stream is not a tar archive); [`Error::Backend`] when reading `from` fails.
pub fn check_archive<R: Read>(from: R) -> Result<ArchiveStats, Error> {
    rewrite_archive(from, io::sink(), ArchiveSource::Restore)
}

/// Reads the archive `from`, checks every entry against the snapshot rules (see the module
/// documentation and [`ArchiveSource`]) and writes it to `to` in the canonical form, returning
/// what it holds. Nothing is buffered beyond one entry's header: file contents are copied as
/// they are read. Rules:
///
/// - a path is relative, at most [`MAX_ARCHIVE_PATH_BYTES`] bytes, each component at most
///   [`MAX_ARCHIVE_NAME_BYTES`], with no empty, `.` or `..` component and no NUL byte (one
///   leading `./` is accepted); only a directory's name may end with `/`;
/// - an entry is a regular file, a directory or a symbolic link (with a target that is not
///   empty; the target itself is not checked: links are stored, never followed);
/// - no entry lies beneath a link or a file of the archive, and no path appears twice (a
///   directory may appear after entries beneath it);
/// - at most [`MAX_ARCHIVE_ENTRIES`] entries, directories that paths imply counted in.
///
/// On an error, `to` holds a partial archive: write to a temporary file and rename it into
/// place on success.
///
/// ```
/// use sessionbox_archive::{ArchiveSource, check_archive, rewrite_archive};
/// let mut out = Vec::new();
/// let empty = [0u8; 1024];
/// let stats = rewrite_archive(&empty[..], &mut out, ArchiveSource::Workspace).unwrap();
/// assert_eq!(stats.entries(), 0);
/// assert_eq!(check_archive(&out[..]).unwrap(), stats);
/// ```
///
/// # Errors
/// [`Error::InvalidRequest`] for a rule broken (see [`ArchiveSource`]) or a stream that is not
/// a tar archive; [`Error::TooLarge`] for too many entries of a [`ArchiveSource::Workspace`];
/// [`Error::Backend`] when reading `from` or writing `to` fails.
pub fn rewrite_archive<R: Read, W: Write>(
    from: R,
    to: W,
    source: ArchiveSource,
) -> Result<ArchiveStats, Error> {
    let mut reader = Watched {
        inner: from,
        failed: None,
    };
    let mut out = Out {
        inner: to,
        failed: None,
    };
    let result = rewrite(&mut reader, &mut out, source, MAX_ARCHIVE_ENTRIES);
    // An I/O failure of the caller's own reader or writer is theirs to report, whatever the
    // tar layer made of it.
    if let Some(e) = reader.failed.take() {
        return Err(Error::Backend(format!("cannot read the archive: {e}")));
    }
    if let Some(e) = out.failed.take() {
        return Err(Error::Backend(format!("cannot write the archive: {e}")));
    }
    result
}

/// What a path of the archive names, as far as the entries so far tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    File,
    Link,
    Directory,
    /// A directory no entry names, implied by an entry beneath it.
    Implied,
}

/// The paths seen so far, keyed by a 128-bit hash of their bytes under random keys (so an
/// archive cannot choose collisions, and a million long paths do not sit in memory).
///
/// Invariant: every path in the map has all its ancestors in it, as [`Seen::Directory`] or
/// [`Seen::Implied`]; so a path's ancestors are checked by walking up only until one is found.
struct Paths {
    keys: (RandomState, RandomState),
    seen: HashMap<u128, Seen>,
}

impl Paths {
    fn new() -> Self {
        Paths {
            keys: (RandomState::new(), RandomState::new()),
            seen: HashMap::new(),
        }
    }

    fn key(&self, path: &[u8]) -> u128 {
        (u128::from(self.keys.0.hash_one(path)) << 64) | u128::from(self.keys.1.hash_one(path))
    }
}

fn invalid(path: &[u8], why: &str) -> Error {
    Error::InvalidRequest(format!(
        "the archive entry {:?} {why}",
        String::from_utf8_lossy(path)
    ))
}

/// Checks an entry's name and returns it without a leading `./` or a trailing `/`; `None`
/// for the root's own entry (`.`, `./`).
fn clean_path(raw: &[u8], is_dir: bool) -> Result<Option<&[u8]>, Error> {
    let mut p = raw;
    while let Some(rest) = p.strip_prefix(b"./") {
        p = rest;
    }
    if p.is_empty() || p == b"." {
        return if raw.is_empty() {
            Err(invalid(raw, "has an empty name"))
        } else {
            Ok(None)
        };
    }
    if p.ends_with(b"/") {
        if !is_dir {
            return Err(invalid(raw, "ends with '/' but is not a directory"));
        }
        p = &p[..p.len() - 1];
    }
    if p.starts_with(b"/") {
        return Err(invalid(raw, "is an absolute path"));
    }
    if p.contains(&0) {
        return Err(invalid(raw, "contains a NUL byte"));
    }
    if p.len() > MAX_ARCHIVE_PATH_BYTES {
        return Err(invalid(
            raw,
            &format!("is longer than {MAX_ARCHIVE_PATH_BYTES} bytes"),
        ));
    }
    for c in p.split(|b| *b == b'/') {
        match c {
            b"" => return Err(invalid(raw, "has an empty component ('//')")),
            b"." => return Err(invalid(raw, "has a '.' component")),
            b".." => return Err(invalid(raw, "has a '..' component")),
            c if c.len() > MAX_ARCHIVE_NAME_BYTES => {
                return Err(invalid(
                    raw,
                    &format!("has a component longer than {MAX_ARCHIVE_NAME_BYTES} bytes"),
                ));
            }
            _ => {}
        }
    }
    Ok(Some(p))
}

/// The three kinds an archive keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Directory,
    Link,
}

fn rewrite<R: Read, W: Write>(
    from: &mut R,
    to: &mut W,
    source: ArchiveSource,
    max_entries: u64,
) -> Result<ArchiveStats, Error> {
    // The tar reader's own words may quote the bytes it choked on (a file that is not an
    // archive would have its contents in the error): only what kind of fault it was is kept.
    let not_tar = |e: io::Error| {
        Error::InvalidRequest(format!(
            "the archive cannot be read ({:?}): it is not a POSIX tar archive, or it is cut \
             short; send a tar, or one compressed with zstd",
            e.kind()
        ))
    };
    let mut archive = tar::Archive::new(from);
    let mut stats = ArchiveStats::default();
    let mut paths = Paths::new();
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        let header = entry.header();
        let entry_type = header.entry_type();
        let raw_path = entry.path_bytes().into_owned();
        let kind = match entry_type {
            tar::EntryType::Regular => Kind::File,
            tar::EntryType::Directory => Kind::Directory,
            tar::EntryType::Symlink => Kind::Link,
            // A global header (git archive writes one with the commit) describes no file.
            tar::EntryType::XGlobalHeader => continue,
            tar::EntryType::Link => {
                return Err(invalid(
                    &raw_path,
                    "is a hard link (an archive stores each hard link as a separate file)",
                ));
            }
            tar::EntryType::GNUSparse => {
                return Err(invalid(&raw_path, "is a sparse file (not supported)"));
            }
            _ if source == ArchiveSource::Workspace => {
                stats.skipped += 1;
                if stats.skipped > max_entries {
                    return Err(too_many(source, max_entries));
                }
                continue;
            }
            other => {
                return Err(invalid(
                    &raw_path,
                    &format!(
                        "is of a kind an archive may not hold (type {:?}); only regular files, \
                         directories and symbolic links",
                        char::from(other.as_byte())
                    ),
                ));
            }
        };
        let Some(path) = clean_path(&raw_path, kind == Kind::Directory)? else {
            continue;
        };
        let path = path.to_vec();
        let mode = header
            .mode()
            .map_err(|e| invalid(&raw_path, &format!("has a bad mode ({e})")))?;
        let mtime = header.mtime().unwrap_or(0);
        let link = match kind {
            Kind::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.is_empty() {
                    return Err(invalid(&raw_path, "is a symbolic link without a target"));
                }
                if target.contains(&0) || target.len() > MAX_ARCHIVE_PATH_BYTES {
                    return Err(invalid(&raw_path, "has a link target that cannot exist"));
                }
                Some(target)
            }
            _ => None,
        };
        record(&mut paths, &path, kind, &raw_path)?;
        match kind {
            Kind::File => stats.files += 1,
            Kind::Directory => stats.directories += 1,
            Kind::Link => stats.links += 1,
        }
        if stats.entries() > max_entries || paths.seen.len() as u64 > max_entries {
            return Err(too_many(source, max_entries));
        }
        let size = if kind == Kind::File { entry.size() } else { 0 };
        let canonical = Canonical {
            path: &path,
            kind,
            mode,
            mtime,
            size,
            link: link.as_deref(),
        };
        write_header(to, &canonical).map_err(wrote)?;
        if kind == Kind::File {
            let copied = io::copy(&mut entry, to).map_err(not_tar)?;
            if copied != size {
                return Err(invalid(
                    &raw_path,
                    &format!("is cut short ({copied} of {size} bytes)"),
                ));
            }
            pad(to, size).map_err(wrote)?;
            stats.bytes += size;
        }
    }
    to.write_all(&[0u8; 1024]).map_err(wrote)?;
    to.flush().map_err(wrote)?;
    Ok(stats)
}

fn wrote(e: io::Error) -> Error {
    Error::Backend(format!("cannot write the archive: {e}"))
}

fn too_many(source: ArchiveSource, max: u64) -> Error {
    match source {
        ArchiveSource::Workspace => Error::TooLarge {
            what: "the workspace (entries: files, directories and links)".into(),
            limit: max,
        },
        ArchiveSource::Restore => Error::InvalidRequest(format!(
            "the archive holds more than {max} entries (files, directories and links, \
             directories its paths imply counted in)"
        )),
    }
}

/// Records `path` (already clean) as `kind`, refusing a path beneath a link or a file of the
/// archive, a path seen before, and a file or link where earlier entries implied a directory.
fn record(paths: &mut Paths, path: &[u8], kind: Kind, raw: &[u8]) -> Result<(), Error> {
    // Walk up from the parent until an ancestor already known (whose own ancestors are fine
    // by the invariant), recording the unknown ones as implied directories.
    let mut implied = Vec::new();
    let mut cut = path.len();
    while let Some(i) = path[..cut].iter().rposition(|b| *b == b'/') {
        cut = i;
        let key = paths.key(&path[..cut]);
        match paths.seen.get(&key) {
            Some(Seen::Directory | Seen::Implied) => break,
            Some(Seen::Link) => {
                return Err(invalid(
                    raw,
                    &format!(
                        "lies beneath {:?}, a symbolic link of the archive",
                        String::from_utf8_lossy(&path[..cut])
                    ),
                ));
            }
            Some(Seen::File) => {
                return Err(invalid(
                    raw,
                    &format!(
                        "lies beneath {:?}, a file of the archive",
                        String::from_utf8_lossy(&path[..cut])
                    ),
                ));
            }
            None => implied.push(key),
        }
    }
    for key in implied {
        paths.seen.insert(key, Seen::Implied);
    }
    let key = paths.key(path);
    let now = match kind {
        Kind::File => Seen::File,
        Kind::Link => Seen::Link,
        Kind::Directory => Seen::Directory,
    };
    match (paths.seen.get(&key), kind) {
        (None, _) => {}
        (Some(Seen::Implied), Kind::Directory) => {}
        (Some(Seen::Implied), _) => {
            return Err(invalid(
                raw,
                "is not a directory, but earlier entries lie beneath it",
            ));
        }
        (Some(_), _) => return Err(invalid(raw, "appears twice in the archive")),
    }
    paths.seen.insert(key, now);
    Ok(())
}

/// One entry in the canonical form.
struct Canonical<'a> {
    path: &'a [u8],
    kind: Kind,
    mode: u32,
    mtime: u64,
    size: u64,
    link: Option<&'a [u8]>,
}

/// Largest size or time the ustar header's 11 octal digits hold.
const USTAR_MAX_NUMBER: u64 = 0o77_777_777_777;

/// Splits `name` into ustar's `prefix` (155 bytes) and `name` (100 bytes) fields at a `/`.
fn ustar_split(name: &[u8]) -> Option<(&[u8], &[u8])> {
    if name.len() <= 100 {
        return Some((&[], name));
    }
    name.iter()
        .enumerate()
        .filter(|(i, b)| **b == b'/' && *i > 0 && *i <= 155 && i + 1 < name.len())
        .filter(|(i, _)| name.len() - i - 1 <= 100)
        .map(|(i, _)| (&name[..i], &name[i + 1..]))
        .next()
}

/// One PAX record: `LEN key=value\n`, where LEN counts the whole record, itself included.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

fn write_header<W: Write>(to: &mut W, e: &Canonical<'_>) -> io::Result<()> {
    let mut name = e.path.to_vec();
    if e.kind == Kind::Directory {
        name.push(b'/');
    }
    let split = ustar_split(&name);
    let link_fits = e.link.is_none_or(|l| l.len() <= 100);
    let mut pax = Vec::new();
    if split.is_none() {
        pax_record(&mut pax, "path", &name);
    }
    if !link_fits {
        pax_record(&mut pax, "linkpath", e.link.unwrap_or_default());
    }
    if e.size > USTAR_MAX_NUMBER {
        pax_record(&mut pax, "size", e.size.to_string().as_bytes());
    }
    if !pax.is_empty() {
        let binary = (split.is_none() && std::str::from_utf8(&name).is_err())
            || (!link_fits && std::str::from_utf8(e.link.unwrap_or_default()).is_err());
        if binary {
            // Values that are not UTF-8 are raw bytes, not text to convert.
            let mut with = Vec::new();
            pax_record(&mut with, "hdrcharset", b"BINARY");
            with.extend_from_slice(&pax);
            pax = with;
        }
        let mut x = tar::Header::new_ustar();
        set_field(&mut x, |u| &mut u.name, b"././@PaxHeader");
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_mode(0o644);
        x.set_uid(0);
        x.set_gid(0);
        x.set_mtime(e.mtime.min(USTAR_MAX_NUMBER));
        x.set_size(pax.len() as u64);
        x.set_cksum();
        to.write_all(x.as_bytes())?;
        to.write_all(&pax)?;
        pad(to, pax.len() as u64)?;
    }
    let mut h = tar::Header::new_ustar();
    match split {
        Some((prefix, rest)) => {
            set_field(&mut h, |u| &mut u.prefix, prefix);
            set_field(&mut h, |u| &mut u.name, rest);
        }
        // The PAX path is the name; the header keeps a cut one for readers without PAX.
        None => set_field(&mut h, |u| &mut u.name, &name[..100]),
    }
    if let Some(link) = e.link {
        set_field(&mut h, |u| &mut u.linkname, &link[..link.len().min(100)]);
    }
    h.set_entry_type(match e.kind {
        Kind::File => tar::EntryType::Regular,
        Kind::Directory => tar::EntryType::Directory,
        Kind::Link => tar::EntryType::Symlink,
    });
    h.set_mode(match e.kind {
        Kind::Link => 0o777,
        _ => e.mode & 0o1777,
    });
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(e.mtime.min(USTAR_MAX_NUMBER));
    h.set_size(if e.size > USTAR_MAX_NUMBER { 0 } else { e.size });
    h.set_cksum();
    to.write_all(h.as_bytes())
}

/// Copies `value` into a fixed field of a ustar header (zero-filled past it).
fn set_field(
    h: &mut tar::Header,
    field: impl FnOnce(&mut tar::UstarHeader) -> &mut [u8],
    value: &[u8],
) {
    if let Some(u) = h.as_ustar_mut() {
        let f = field(u);
        let n = value.len().min(f.len());
        f[..n].copy_from_slice(&value[..n]);
        f[n..].fill(0);
    }
}

/// Writes the zeros that round `len` bytes up to a 512-byte block.
fn pad<W: Write>(to: &mut W, len: u64) -> io::Result<()> {
    let rem = (len % 512) as usize;
    if rem != 0 {
        to.write_all(&[0u8; 512][..512 - rem])?;
    }
    Ok(())
}

/// The caller's reader, with its first failure kept aside.
struct Watched<R> {
    inner: R,
    failed: Option<io::Error>,
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if self.failed.is_none() && e.kind() != io::ErrorKind::Interrupted {
                self.failed = Some(io::Error::new(e.kind(), e.to_string()));
            }
        })
    }
}

/// The caller's writer, with its first failure kept aside.
struct Out<W> {
    inner: W,
    failed: Option<io::Error>,
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| {
            if self.failed.is_none() && e.kind() != io::ErrorKind::Interrupted {
                self.failed = Some(io::Error::new(e.kind(), e.to_string()));
            }
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
