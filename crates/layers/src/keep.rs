//! Keeping a layer's tar stream as a zstd-compressed archive while it is
//! read: a snapshot's changes are unpacked into the store (what overlayfs
//! stacks) and, from the same bytes, written once as `layer.tar.zst` (its
//! portable form, and the measure of what it costs to keep and move).
//!
//! [`ArchivingReader`] wraps the stream the unpacker reads; every byte read
//! through it is compressed into the archive and counted. [`ArchivingReader::finish`]
//! reads what the unpacker left (the tar's end blocks), closes the zstd
//! frame, syncs the file and gives the sizes and the archive's digest.

use std::fs::File;
use std::io::{self, Read, Write};

use sha2::{Digest, Sha256};

/// The zstd level snapshots are written at unless configured: zstd's own
/// default, about three times faster than level 9 for a few percent more.
pub const DEFAULT_LEVEL: i32 = 3;

/// The levels zstd accepts (negative ones are its fast modes).
pub const LEVELS: std::ops::RangeInclusive<i32> = -7..=19;

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    /// Bytes of the uncompressed tar stream.
    pub tar_bytes: u64,
    /// Bytes of the compressed archive.
    pub archive_bytes: u64,
    /// `sha256:<hex>` of the compressed archive.
    pub digest: String,
}

/// A file writer that hashes and counts what it writes.
struct Digesting {
    file: File,
    hash: Sha256,
    bytes: u64,
}

impl Write for Digesting {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = self.file.write(data)?;
        self.hash.update(&data[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// A reader that compresses everything read through it into an archive.
pub struct ArchivingReader<R> {
    inner: R,
    encoder: zstd::stream::write::Encoder<'static, Digesting>,
    tar_bytes: u64,
}

impl<R: Read> ArchivingReader<R> {
    /// Reads `inner`, writing the archive to `out` at zstd `level`
    /// (clamped to [`LEVELS`]).
    pub fn new(inner: R, out: File, level: i32) -> io::Result<ArchivingReader<R>> {
        let level = level.clamp(*LEVELS.start(), *LEVELS.end());
        let sink = Digesting {
            file: out,
            hash: Sha256::new(),
            bytes: 0,
        };
        Ok(ArchivingReader {
            inner,
            encoder: zstd::stream::write::Encoder::new(sink, level)?,
            tar_bytes: 0,
        })
    }

    /// Reads the rest of the stream into the archive, ends it and syncs
    /// the file.
    pub fn finish(mut self) -> io::Result<Archived> {
        io::copy(&mut self, &mut io::sink())?;
        let sink = self.encoder.finish()?;
        sink.file.sync_all()?;
        let digest: String = sink
            .hash
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Archived {
            tar_bytes: self.tar_bytes,
            archive_bytes: sink.bytes,
            digest: format!("sha256:{digest}"),
        })
    }
}

impl<R: Read> Read for ArchivingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.encoder.write_all(&buf[..n])?;
        self.tar_bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_archive_holds_every_byte_even_those_left_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.tar.zst");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 7) as u8).collect();
        let mut reader = ArchivingReader::new(&data[..], File::create(&path).unwrap(), 99).unwrap();
        let mut first = vec![0u8; 1000];
        reader.read_exact(&mut first).unwrap();
        let archived = reader.finish().unwrap();
        assert_eq!(archived.tar_bytes, data.len() as u64);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(archived.archive_bytes, on_disk.len() as u64);
        assert!(archived.archive_bytes < archived.tar_bytes / 10);
        let hex: String = Sha256::digest(&on_disk)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(archived.digest, format!("sha256:{hex}"));
        assert_eq!(zstd::decode_all(&on_disk[..]).unwrap(), data);
    }
}
