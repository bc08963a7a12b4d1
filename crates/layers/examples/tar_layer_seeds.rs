//! Writes the seed corpus of the `tar_layer` fuzz target: small layers of
//! every kind the unpacker reads (plain, gzip, zstd, whiteouts, opaque
//! directories, links) and of the tricks it refuses (a symlink a later
//! entry goes through, `..`, a hard link out, a truncated stream).
//!
//!     cargo run -p airlock-layers --example tar_layer_seeds -- fuzz/corpus/tar_layer

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use tar::{EntryType, Header};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// One entry, its name written into the header as given.
fn entry(
    tar: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: EntryType,
    link: &str,
    data: &[u8],
) -> Result<()> {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(if kind == EntryType::Directory {
        0o755
    } else {
        0o644
    });
    header.set_mtime(1_600_000_000);
    header.set_size(data.len() as u64);
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_cksum();
    tar.append(&header, data)?;
    Ok(())
}

fn layer(entries: &[(&str, EntryType, &str, &[u8])]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        entry(&mut tar, name, *kind, link, data)?;
    }
    Ok(tar.into_inner()?)
}

fn main() -> Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: tar_layer_seeds DIR")?,
    );
    std::fs::create_dir_all(&dir)?;
    use EntryType as T;
    let plain = layer(&[
        ("./", T::Directory, "", b""),
        ("etc/", T::Directory, "", b""),
        ("etc/conf", T::Regular, "", b"setting=1\n"),
        ("etc/link", T::Symlink, "conf", b""),
        ("etc/hard", T::Link, "etc/conf", b""),
        ("run/pipe", T::Fifo, "", b""),
        ("dev/null", T::Char, "", b""),
    ])?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain)?;
    let gz = gz.finish()?;
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("plain.tar", plain.clone()),
        ("plain.tar.gz", gz.clone()),
        ("plain.tar.zst", zstd::encode_all(plain.as_slice(), 3)?),
        ("truncated.tar.gz", gz[..gz.len() / 2].to_vec()),
        (
            "whiteouts.tar",
            layer(&[
                (".wh.gone", T::Regular, "", b""),
                ("a/", T::Directory, "", b""),
                ("a/.wh..wh..opq", T::Regular, "", b""),
                ("a/keep", T::Regular, "", b"k"),
                (".wh.a", T::Regular, "", b""),
                (".wh.back", T::Regular, "", b""),
                ("back/", T::Directory, "", b""),
                (".wh...", T::Regular, "", b""),
            ])?,
        ),
        (
            "symlink-trick.tar",
            layer(&[
                ("evil", T::Symlink, "/", b""),
                ("evil/etc/x", T::Regular, "", b"out"),
                ("up", T::Symlink, "..", b""),
                ("up/x", T::Regular, "", b"out"),
            ])?,
        ),
        (
            "replace.tar",
            layer(&[
                ("t/sub/f", T::Regular, "", b"f"),
                ("t", T::Regular, "", b"now a file"),
                ("s", T::Symlink, "/", b""),
                ("s/", T::Directory, "", b""),
                ("h", T::Regular, "", b"h"),
                ("h2", T::Link, "h", b""),
                ("h3", T::Link, "../../etc/passwd", b""),
            ])?,
        ),
        (
            "dot-dot.tar",
            layer(&[
                ("/abs", T::Regular, "", b"in"),
                ("a/../../x", T::Regular, "", b"out"),
            ])?,
        ),
    ];
    for (name, data) in seeds {
        std::fs::write(dir.join(name), data)?;
    }
    Ok(())
}
