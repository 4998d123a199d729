//! The workspace archive format of sessionbox snapshots (the rules are in
//! [`sessionbox_core::ArchiveStats`]'s module): [`check_archive`] reads a whole archive and
//! says whether it keeps every rule, counting what it holds, before anything acts on it;
//! [`rewrite_archive`] also writes it out in the canonical form, so whatever reads it later
//! sees only that form.
//!
//! Architecture invariant: pure over readers and writers. This crate knows no workspace,
//! runtime, store or wire; what writes an archive out of a workspace and into one is the file
//! layer's (`sessionbox-fs`), which follows the same rules.
//!
//! ```
//! let mut b = tar::Builder::new(Vec::new());
//! let mut h = tar::Header::new_ustar();
//! h.set_entry_type(tar::EntryType::Regular);
//! h.set_size(2);
//! h.set_mode(0o644);
//! b.append_data(&mut h, "notes/a.txt", &b"hi"[..])?;
//! let archive = b.into_inner()?;
//! let stats = sessionbox_archive::check_archive(&archive[..])?;
//! assert_eq!((stats.files, stats.bytes), (1, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod extensions;
mod rewrite;

pub use extensions::{MAX_EXTENSION_BYTES, check_extension_sizes};

pub use rewrite::{
    ArchiveSource, MAX_ARCHIVE_NAME_BYTES, MAX_ARCHIVE_PATH_BYTES, check_archive, rewrite_archive,
};
