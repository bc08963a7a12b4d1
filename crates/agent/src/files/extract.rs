//! `extract`: a tar stream unpacked into a directory, as the agent (root
//! inside the sandbox). What a template build's COPY sends: the host packs
//! the build context's files (`airlock_build::context`) and the sandbox
//! unpacks them where its own filesystem says (a destination through a
//! symlink of the image resolves as the image has it), with the modes,
//! numeric owners and times the stream gives.
//!
//! The stream comes from the host, but the directory is the sandbox's: the
//! unpacker (the `tar` crate's) keeps every entry inside `dir` as that
//! directory resolves in here, and nothing here is outside the sandbox.

use super::{blocking, lossy, WriteMsg};
use crate::failure::Failure;
use crate::outbox::Outbox;
use airlock_protocol::Event;
use std::io::{self, Read};
use std::path::PathBuf;
use tokio::sync::mpsc;

/// Chunks of the stream that may wait for the unpacker.
const QUEUE: usize = 4;

/// A blocking reader over the chunks an async task hands it; the end of
/// the channel is the end of the stream.
struct Chunks {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn unpack(dir: &PathBuf, stream: Chunks) -> Result<(), Failure> {
    let shown = lossy(dir);
    std::fs::create_dir_all(dir).map_err(|e| Failure::io(format!("cannot create {shown}"), &e))?;
    let mut archive = tar::Archive::new(stream);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    archive.set_unpack_xattrs(false);
    archive
        .unpack(dir)
        .map_err(|e| Failure::io(format!("cannot unpack into {shown}"), &e))
}

/// One open `extract`: answers `written` (the stream's bytes) once the
/// stream ended and every entry is in place, or one `error`, after which
/// the rest of the id's frames are ignored.
pub(crate) async fn extract_task(
    outbox: Outbox,
    id: u64,
    dir: PathBuf,
    mut rx: mpsc::Receiver<WriteMsg>,
) {
    let (chunks, stream) = mpsc::channel(QUEUE);
    let worker = blocking(move || {
        unpack(
            &dir,
            Chunks {
                rx: stream,
                chunk: Vec::new(),
                at: 0,
            },
        )
    });
    let feed = async {
        let mut total: u64 = 0;
        while let Some(msg) = rx.recv().await {
            match msg {
                WriteMsg::Data(data) => {
                    total += data.len() as u64;
                    // The unpacker stopped (an error it reports); keep
                    // reading to the end of the id's frames.
                    let _ = chunks.send(data).await;
                }
                WriteMsg::End => return Some(total),
            }
        }
        None
    };
    let (total, unpacked) = {
        let total = feed.await;
        drop(chunks);
        (total, worker.await)
    };
    match (total, unpacked) {
        // The session ended before `write_end`: nobody to answer.
        (None, _) => {}
        (Some(bytes), Ok(())) => {
            outbox.send(id, Event::Written { bytes }).await;
        }
        (Some(_), Err(failure)) => {
            outbox.fail(id, failure).await;
        }
    }
}
