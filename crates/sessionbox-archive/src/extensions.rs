//! A bound on the extension headers of an archive (PAX records, GNU long names), checked on
//! the file before any tar reader loads one into memory.

use std::fs::File;

use sessionbox_core::Error;
use tar::Header;

fn refuse(what: impl std::fmt::Display) -> Error {
    Error::InvalidRequest(format!("invalid workspace archive: {what}"))
}

fn not_tar(e: &std::io::Error) -> Error {
    refuse(format!(
        "it is not a readable tar archive ({:?}); send a tar, or one compressed with zstd",
        e.kind()
    ))
}

/// Largest PAX extended header or GNU long name an archive may hold (the tar reader holds each
/// in memory whole): 64 KiB, far more than a path of 4095 bytes needs.
pub const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// Walks the headers of the archive in `archive` as the tar reader will (a PAX `size` record
/// applies to the next entry that is not an extension) and refuses an extension header larger
/// than [`MAX_EXTENSION_BYTES`] before a reader would load it into memory. Call it before
/// [`crate::check_archive`] or [`crate::rewrite_archive`] on an archive from outside.
///
/// # Errors
/// [`Error::InvalidRequest`] for an extension past the limit or a header that is not tar;
/// [`Error::Backend`] when the file cannot be read.
pub fn check_extension_sizes(archive: &File) -> Result<(), Error> {
    use std::os::unix::fs::FileExt;
    let read = |buf: &mut [u8], at: u64| {
        archive
            .read_exact_at(buf, at)
            .map_err(|e| Error::Backend(format!("cannot read the archive: {e}")))
    };
    let len = archive
        .metadata()
        .map_err(|e| Error::Backend(format!("cannot read the archive: {e}")))?
        .len();
    let mut at = 0u64;
    let mut pax_size: Option<u64> = None;
    let mut block = [0u8; 512];
    while at.saturating_add(512) <= len {
        read(&mut block, at)?;
        if block.iter().all(|b| *b == 0) {
            break;
        }
        let h = Header::from_byte_slice(&block);
        let recognized = h.as_ustar().is_some() || h.as_gnu().is_some();
        let t = h.entry_type();
        let extension = t.is_pax_local_extensions()
            || t.is_pax_global_extensions()
            || t.is_gnu_longname()
            || t.is_gnu_longlink();
        let mut size = h.entry_size().map_err(|e| not_tar(&e))?;
        if extension {
            if size > MAX_EXTENSION_BYTES {
                return Err(refuse(format!(
                    "an extended header of {size} bytes (at most {MAX_EXTENSION_BYTES})"
                )));
            }
            if recognized && t.is_pax_local_extensions() {
                let mut data = vec![0u8; usize::try_from(size).unwrap_or(0)];
                read(&mut data, at + 512)?;
                pax_size = pax_value(&data, b"size")
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
            }
        } else if let Some(s) = pax_size.take().filter(|_| recognized) {
            size = s;
        }
        at = at
            .saturating_add(512)
            .saturating_add(size.div_ceil(512).saturating_mul(512));
    }
    Ok(())
}

/// The value of `key` in PAX records, the last one given.
fn pax_value<'a>(mut data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut found = None;
    while !data.is_empty() {
        let space = data.iter().position(|c| *c == b' ')?;
        let len: usize = std::str::from_utf8(&data[..space]).ok()?.parse().ok()?;
        if len <= space || len > data.len() {
            return found;
        }
        let record = &data[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|c| *c == b'=')
            && &record[..eq] == key
        {
            found = Some(&record[eq + 1..]);
        }
        data = &data[len..];
    }
    found
}
