//! Directory listings of any size, with bounded memory.
//!
//! A [`Walk`] visits a tree depth first holding one open directory per
//! level (at most [`MAX_LIST_DEPTH`]), never a list of what it has seen.
//! On top of it:
//!
//! - a page ([`page`]) walks the whole tree and keeps, in a max-heap, the
//!   smallest paths after the resume point that fit the page: memory is one
//!   page whatever the tree holds, at the price of a walk per page;
//! - a stream ([`Walk::chunk`]) sends the tree in walk order, one chunk at
//!   a time, each chunk on its own blocking call so no blocking thread
//!   waits for the host.
//!
//! Paths are ordered and resumed by their bytes, so names that are not
//! UTF-8 (shown with U+FFFD) are neither merged nor skipped: the resume
//! token is the last path's bytes in URL-safe base64.

use super::{file_info, xattrs};
use crate::failure::Failure;
use airlock_protocol::{
    ErrorKind, FileInfo, MAX_HEADER_BYTES, MAX_LIST_DEPTH, MAX_LIST_PAGE, MAX_LIST_WALK,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use std::collections::{BinaryHeap, HashMap};
use std::ffi::OsString;
use std::fs::{self, FileType, ReadDir};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Estimated bytes of a page's candidates before the heap drops the
/// largest paths. Most entries cost less than their estimate, so a page
/// usually ends here, well inside one frame.
const PAGE_BYTES: usize = 896 << 10;
/// What the entries of one answer may encode to: one frame's header with
/// room for the rest of the event (the resume token is at most ~5.5 KiB).
const FRAME_BYTES: usize = MAX_HEADER_BYTES - (64 << 10);
/// Entries of one `entries_chunk`.
const CHUNK_ENTRIES: usize = 2000;
/// Encoded bytes of one `entries_chunk`.
const CHUNK_BYTES: usize = 256 << 10;
/// Longest resume token: the base64 of a path of PATH_MAX bytes.
const MAX_TOKEN: usize = 4096 * 4 / 3 + 4;

/// Checks the depth of a paged or streamed listing.
pub(super) fn check_depth(depth: u32) -> Result<(), Failure> {
    if (1..=MAX_LIST_DEPTH).contains(&depth) {
        Ok(())
    } else {
        Err(Failure::invalid(format!(
            "the depth of a listing must be between 1 and {MAX_LIST_DEPTH}"
        )))
    }
}

/// A depth-first walk of a tree to a depth, one open directory per level.
pub(super) struct Walk {
    depth: u32,
    /// The open directories, outermost first, with their level (1 = root).
    open: Vec<(ReadDir, u32)>,
    /// The prefix of the extended attributes each entry reports.
    xattrs: Option<String>,
    /// Whether each filesystem met (by device) may hold attributes: one
    /// that has none is not asked again for each of its entries.
    xattr_devices: HashMap<u64, bool>,
}

impl Walk {
    /// Starts at `root`, which must be a directory (a symlink to one is
    /// followed, as before: only the entries under it are not).
    pub(super) fn start(root: &Path, depth: u32) -> Result<Walk, Failure> {
        let shown = root.display();
        let meta = fs::metadata(root)
            .map_err(|error| Failure::io(format!("cannot list {shown}"), &error))?;
        if !meta.is_dir() {
            return Err(Failure::new(
                ErrorKind::NotADirectory,
                format!("{shown} is not a directory"),
            ));
        }
        let reader = fs::read_dir(root)
            .map_err(|error| Failure::io(format!("cannot list {shown}"), &error))?;
        Ok(Walk {
            depth,
            open: vec![(reader, 1)],
            xattrs: None,
            xattr_devices: HashMap::new(),
        })
    }

    /// The walk, its entries reporting their extended attributes under
    /// `prefix` (checked by the caller).
    pub(super) fn reporting_xattrs(mut self, prefix: Option<String>) -> Walk {
        self.xattrs = prefix;
        self
    }

    /// The next entry: its path and type (from the directory entry, so a
    /// symlink is a symlink). Entries that cannot be read, and
    /// subdirectories that vanished or cannot be opened, are skipped.
    fn next_entry(&mut self) -> Option<(PathBuf, FileType)> {
        loop {
            let (reader, level) = self.open.last_mut()?;
            let level = *level;
            let Some(next) = reader.next() else {
                self.open.pop();
                continue;
            };
            let Ok(entry) = next else { continue };
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if file_type.is_dir() && level < self.depth {
                if let Ok(reader) = fs::read_dir(&path) {
                    self.open.push((reader, level + 1));
                }
            }
            return Some((path, file_type));
        }
    }

    /// Entries with their metadata (an entry removed since it was read is
    /// skipped).
    fn next_info(&mut self) -> Option<FileInfo> {
        loop {
            let (path, _) = self.next_entry()?;
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let mut info = file_info(&path, &meta);
            if let Some(prefix) = &self.xattrs {
                // A symlink's attributes are its target's, which may be on
                // any filesystem.
                let may_hold = meta.file_type().is_symlink()
                    || *self
                        .xattr_devices
                        .entry(meta.dev())
                        .or_insert_with(|| xattrs::supported(&path, prefix));
                if may_hold {
                    info.xattrs = xattrs::read(&path, prefix);
                }
            }
            return Some(info);
        }
    }

    /// The next chunk of a stream that may send `allowed` more entries:
    /// at most [`CHUNK_ENTRIES`] and about [`CHUNK_BYTES`] encoded. Returns
    /// the chunk and whether the walk is over; when `allowed` runs out
    /// first, the walk is over and `truncated` says whether entries remain.
    pub(super) fn chunk(&mut self, allowed: u64) -> Chunk {
        let mut chunk = Chunk::default();
        let mut bytes = 0;
        while chunk.entries.len() < CHUNK_ENTRIES && bytes < CHUNK_BYTES {
            if chunk.entries.len() as u64 >= allowed {
                chunk.ended = true;
                chunk.truncated = self.next_entry().is_some();
                return chunk;
            }
            let Some(info) = self.next_info() else {
                chunk.ended = true;
                return chunk;
            };
            bytes += encoded_len(&info);
            chunk.entries.push(info);
        }
        chunk
    }
}

/// One step of a stream.
#[derive(Debug, Default)]
pub(super) struct Chunk {
    pub(super) entries: Vec<FileInfo>,
    /// Nothing follows this chunk.
    pub(super) ended: bool,
    /// The walk stopped at the request's limit with entries left.
    pub(super) truncated: bool,
}

/// A candidate of a page: its path's bytes, ordered by them.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    key: Vec<u8>,
}

impl Candidate {
    /// What the entry is guessed to encode to, before it is looked at.
    fn estimate(&self) -> usize {
        2 * self.key.len() + 128
    }
}

/// A page of a listing and the token of the next, if any.
#[derive(Debug)]
pub(super) struct Page {
    pub(super) entries: Vec<FileInfo>,
    pub(super) next: Option<String>,
}

/// The page of the tree under `root` after the token `after`.
pub(super) fn page(
    root: &Path,
    depth: u32,
    after: Option<&str>,
    limit: u32,
) -> Result<Page, Failure> {
    if !(1..=MAX_LIST_PAGE).contains(&limit) {
        return Err(Failure::invalid(format!(
            "the limit of a page must be between 1 and {MAX_LIST_PAGE}"
        )));
    }
    let after = after.map(decode_token).transpose()?;
    let limit = limit as usize;
    let mut walk = Walk::start(root, depth)?;
    let mut heap: BinaryHeap<Candidate> = BinaryHeap::new();
    let mut bytes = 0usize;
    let mut walked: u64 = 0;
    // Whether an entry after `after` was left out of the page.
    let mut more = false;
    while let Some((path, _)) = walk.next_entry() {
        walked += 1;
        if walked > MAX_LIST_WALK {
            return Err(Failure::invalid(format!(
                "{} holds more than {MAX_LIST_WALK} entries to depth {depth}; \
                 list with a smaller depth or a deeper path",
                root.display()
            )));
        }
        let key = path.into_os_string().into_vec();
        if after.as_ref().is_some_and(|after| key <= *after) {
            continue;
        }
        let full = heap.len() >= limit || bytes >= PAGE_BYTES;
        if full && heap.peek().is_some_and(|largest| key > largest.key) {
            more = true;
            continue;
        }
        let candidate = Candidate { key };
        bytes += candidate.estimate();
        heap.push(candidate);
        while heap.len() > limit || (bytes > PAGE_BYTES && heap.len() > 1) {
            if let Some(dropped) = heap.pop() {
                bytes -= dropped.estimate();
                more = true;
            }
        }
    }
    let keys = heap.into_sorted_vec();
    let mut entries = Vec::with_capacity(keys.len());
    let mut encoded = 0usize;
    let mut last: Option<&[u8]> = None;
    for candidate in &keys {
        let path = PathBuf::from(OsString::from_vec(candidate.key.clone()));
        // Removed since the walk: left out, but the page still moves past it.
        if let Ok(meta) = fs::symlink_metadata(&path) {
            let info = file_info(&path, &meta);
            let size = encoded_len(&info);
            // Names that escape badly can outgrow the estimate: the page
            // ends before the frame would overflow (never before its first).
            if !entries.is_empty() && encoded + size > FRAME_BYTES {
                more = true;
                break;
            }
            encoded += size;
            entries.push(info);
        }
        last = Some(&candidate.key);
    }
    let next = if more {
        last.map(|key| URL_SAFE_NO_PAD.encode(key))
    } else {
        None
    };
    Ok(Page { entries, next })
}

/// The path bytes a resume token stands for.
fn decode_token(token: &str) -> Result<Vec<u8>, Failure> {
    let invalid = || Failure::invalid("the resume token of the listing is not valid");
    if token.len() > MAX_TOKEN {
        return Err(invalid());
    }
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    // Every path the agent hands out is absolute.
    if bytes.first() != Some(&b'/') {
        return Err(invalid());
    }
    Ok(bytes)
}

/// The whole listing as `list_dir` answers it: sorted, refused past
/// `max` entries or past one frame.
pub(super) fn all(root: &Path, depth: u32, max: usize) -> Result<Vec<FileInfo>, Failure> {
    let shown = root.display();
    let mut walk = Walk::start(root, depth)?;
    let mut entries = Vec::new();
    let mut encoded = 0usize;
    while let Some(info) = walk.next_info() {
        encoded += encoded_len(&info);
        entries.push(info);
        if entries.len() > max {
            return Err(Failure::invalid(format!(
                "{shown} holds more than {max} entries to depth {depth}; \
                 list with a smaller depth"
            )));
        }
        if encoded > FRAME_BYTES {
            return Err(Failure::invalid(format!(
                "the listing of {shown} is too large for one answer; \
                 list with a smaller depth or a deeper path, or by pages"
            )));
        }
    }
    entries.sort_by(|a, b| {
        Path::new(&a.path)
            .as_os_str()
            .as_bytes()
            .cmp(Path::new(&b.path).as_os_str().as_bytes())
    });
    Ok(entries)
}

/// The bytes of `info` as JSON (plus its separator).
fn encoded_len(info: &FileInfo) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(1);
    // Writing to a counter cannot fail; a failure would only undercount.
    let _ = serde_json::to_writer(&mut count, info);
    count.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn names(entries: &[FileInfo]) -> Vec<&str> {
        entries.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn pages_resume_after_the_token_in_byte_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b", "a", "a.txt", "c"] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        fs::create_dir(dir.path().join("d")).unwrap();
        fs::write(dir.path().join("d/inner"), b"").unwrap();
        let first = page(dir.path(), 2, None, 3).unwrap();
        assert_eq!(names(&first.entries), ["a", "a.txt", "b"]);
        let second = page(dir.path(), 2, first.next.as_deref(), 3).unwrap();
        assert_eq!(names(&second.entries), ["c", "d", "inner"]);
        assert_eq!(second.next, None, "the last page has no token");
        let exact = page(dir.path(), 1, None, 5).unwrap();
        assert_eq!(exact.entries.len(), 5);
        assert_eq!(exact.next, None);
    }

    #[test]
    fn names_that_are_not_utf8_are_neither_merged_nor_skipped() {
        let dir = tempfile::tempdir().unwrap();
        for name in [&b"x\xff"[..], b"x\xfe", b"x\xfd"] {
            fs::write(dir.path().join(std::ffi::OsStr::from_bytes(name)), b"").unwrap();
        }
        let mut seen = 0;
        let mut after = None;
        loop {
            let page = page(dir.path(), 1, after.as_deref(), 1).unwrap();
            seen += page.entries.len();
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, 3);
    }

    #[test]
    fn bad_tokens_limits_and_depths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for token in ["***", "cmVsYXRpdmU", &"A".repeat(MAX_TOKEN + 1)] {
            let failure = page(dir.path(), 1, Some(token), 10).unwrap_err();
            assert_eq!(failure.kind, ErrorKind::InvalidArgument, "{token}");
        }
        for limit in [0, MAX_LIST_PAGE + 1] {
            let failure = page(dir.path(), 1, None, limit).unwrap_err();
            assert_eq!(failure.kind, ErrorKind::InvalidArgument);
        }
        assert!(check_depth(0).is_err() && check_depth(MAX_LIST_DEPTH + 1).is_err());
        assert!(check_depth(MAX_LIST_DEPTH).is_ok());
    }

    #[test]
    fn a_page_of_long_names_stays_inside_one_frame() {
        let dir = tempfile::tempdir().unwrap();
        // 255-byte names of control characters: each escapes to six bytes,
        // three times the estimate.
        for i in 0..2000u32 {
            let mut name = format!("{i:05}").into_bytes();
            name.resize(255, 0x01);
            fs::write(dir.path().join(std::ffi::OsStr::from_bytes(&name)), b"").unwrap();
        }
        let mut after = None;
        let mut seen = 0;
        loop {
            let page = page(dir.path(), 1, after.as_deref(), MAX_LIST_PAGE).unwrap();
            let encoded: usize = page.entries.iter().map(encoded_len).sum();
            assert!(encoded <= FRAME_BYTES, "{encoded}");
            assert!(!page.entries.is_empty());
            seen += page.entries.len();
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, 2000);
    }
}
