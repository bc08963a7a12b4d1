//! The byte streams under the tar reader: the blob as read (hashed into the
//! layer's digest), its decompression, and the tar stream (hashed into the
//! `diff_id` and metered, so that the headers of one entry cannot make the
//! tar reader buffer more than [`HEADER_BUDGET`]).

use flate2::read::MultiGzDecoder;
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::io::{self, Read};

/// How many bytes of the tar stream the tar reader may read between two
/// entries: the padding of the last entry, the next header and every
/// extension record in front of it (GNU long names and links, PAX records,
/// sparse maps). The tar crate reads those records into memory whole, so
/// without this bound a layer could make the daemon buffer gigabytes for
/// one name.
pub(crate) const HEADER_BUDGET: u64 = 4 << 20;

/// How a layer blob is compressed, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream (anything that is neither gzip nor zstd).
    None,
    /// gzip (`1f 8b`), one member or several.
    Gzip,
    /// zstd (`28 b5 2f fd`), one frame or several.
    Zstd,
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
/// The longest magic number above.
pub(crate) const MAGIC_LEN: usize = 4;

impl Compression {
    /// The compression whose magic number `prefix` starts with.
    pub fn detect(prefix: &[u8]) -> Self {
        if prefix.starts_with(GZIP_MAGIC) {
            Self::Gzip
        } else if prefix.starts_with(ZSTD_MAGIC) {
            Self::Zstd
        } else {
            Self::None
        }
    }

    /// The decompressed stream of `prefix` (bytes already read) and `rest`.
    pub(crate) fn decoder<'a, R: Read + 'a>(
        self,
        prefix: Vec<u8>,
        rest: R,
    ) -> io::Result<Box<dyn Read + 'a>> {
        let source = io::Cursor::new(prefix).chain(rest);
        Ok(match self {
            Self::None => Box::new(source),
            // Multi-member, as Go's gzip reader (which Docker and
            // containerd use) reads a layer by default.
            Self::Gzip => Box::new(MultiGzDecoder::new(source)),
            Self::Zstd => Box::new(zstd::Decoder::new(source)?),
        })
    }
}

/// What the readers below report to the unpacker, which owns them only
/// through the tar reader while it runs.
#[derive(Debug, Default)]
pub(crate) struct Flags {
    /// The caller's reader (not the decoding of its bytes) failed.
    pub(crate) source_failed: Cell<bool>,
    /// The tar reader hit [`Metered`]'s budget.
    pub(crate) over_budget: Cell<bool>,
    /// What [`Metered`] lets through before it fails.
    pub(crate) budget: Cell<u64>,
}

/// A reader that hashes and counts what passes through it; the one over the
/// caller's reader also marks its failures in [`Flags::source_failed`], so
/// that an I/O error is not reported as a corrupt layer.
pub(crate) struct Digesting<'f, R> {
    inner: R,
    sha: Sha256,
    failed: Option<&'f Cell<bool>>,
}

impl<'f, R: Read> Digesting<'f, R> {
    pub(crate) fn new(inner: R, failed: Option<&'f Cell<bool>>) -> Self {
        Self {
            inner,
            sha: Sha256::new(),
            failed,
        }
    }

    /// `sha256:<hex>` of everything read so far.
    pub(crate) fn digest(&self) -> String {
        format!("sha256:{:x}", self.sha.clone().finalize())
    }

    /// Reads up to `len` bytes (fewer only at the end of the stream).
    pub(crate) fn peek(&mut self, len: usize) -> io::Result<Vec<u8>> {
        let mut prefix = Vec::with_capacity(len);
        (&mut *self).take(len as u64).read_to_end(&mut prefix)?;
        Ok(prefix)
    }

    /// Reads the rest of the stream, hashing it; fails once more than
    /// `limit` bytes are left, returning how many it read.
    pub(crate) fn drain(&mut self, limit: u64) -> io::Result<Result<u64, u64>> {
        let read = io::copy(&mut (&mut *self).take(limit), &mut io::sink())?;
        if read < limit {
            return Ok(Ok(read));
        }
        let mut one = [0u8; 1];
        match self.read(&mut one)? {
            0 => Ok(Ok(read)),
            _ => Ok(Err(read)),
        }
    }
}

impl<R: Read> Read for Digesting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Ok(n) => {
                    self.sha.update(&buf[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if let Some(failed) = self.failed {
                        failed.set(true);
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// A reader that lets [`Flags::budget`] bytes through and then fails,
/// marking [`Flags::over_budget`].
pub(crate) struct Metered<'f, R> {
    inner: R,
    flags: &'f Flags,
}

impl<'f, R: Read> Metered<'f, R> {
    pub(crate) fn new(inner: R, flags: &'f Flags) -> Self {
        Self { inner, flags }
    }
}

impl<R: Read> Read for Metered<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.flags.budget.get();
        if left == 0 && !buf.is_empty() {
            self.flags.over_budget.set(true);
            return Err(io::Error::other(
                "the tar headers of one entry are over their budget",
            ));
        }
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        let n = self.inner.read(&mut buf[..want])?;
        self.flags.budget.set(left - n as u64);
        Ok(n)
    }
}
