//! A host channel that survives a checkpoint and restore of the sandbox.
//!
//! gVisor (the runsc of 2022 that Debian ships) restores a host descriptor
//! the sandbox was handed without telling the host's epoll which events its
//! waiters want: an epoll registration made before the checkpoint is woken
//! once by the restore and never again, so an agent waiting for readiness
//! on the channel reads the first frame after a restore and then hangs with
//! the next ones unread in its socket. A blocking `read`/`write` registers
//! a fresh waiter on every call (and a call blocked across the checkpoint
//! is restarted after the restore), so it always sees the channel's events.
//!
//! [`through_threads`] therefore serves the host channel with two blocking
//! threads, each handing bytes to the session through an in-memory queue
//! (saved and restored with the agent's memory): one reads the channel
//! into chunks the session reads as a stream ([`ChunkReader`]), the other takes
//! the session's encoded frames and writes each to the channel whole.
//! Neither way takes a second trip through the sandbox's kernel (on gVisor
//! every such trip is a copy in and out of its kernel, billed to the
//! sandbox's CPU limit): not on the way out, where the bulk of the bytes
//! go (command output, file reads, a forwarded port's answers), nor on the
//! way in (uploads, a forwarded port's requests). End of stream goes
//! through in both ways.

use airlock_protocol::ChunkReader;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use tokio::sync::mpsc;

/// Bytes moved per read on the way in.
const CHUNK: usize = 256 * 1024;
/// Chunks read from the host that may wait for the session (at most
/// `IN_CHUNKS * CHUNK` bytes held).
const IN_CHUNKS: usize = 4;
/// Encoded frames that may wait for the writing thread (each at most a
/// frame's limit; the session's own queue holds the rest).
const OUT_FRAMES: usize = 4;

/// The session's side of a channel served by threads.
#[derive(Debug)]
pub struct Threaded {
    /// What the host sent, in order; reads the end of the stream once the
    /// host's side ended.
    pub(crate) input: ChunkReader,
    /// Whole encoded frames for the host, written in order. Sending fails
    /// once the host is gone; dropping it ends the host's stream.
    pub(crate) output: mpsc::Sender<Vec<u8>>,
}

/// Returns the side the session serves; `host` is then served by two
/// threads of this process.
pub fn through_threads(host: UnixStream) -> std::io::Result<Threaded> {
    host.set_nonblocking(false)?;
    let host_in = host.try_clone()?;
    let (chunks, received) = mpsc::channel(IN_CHUNKS);
    let (output, frames) = mpsc::channel(OUT_FRAMES);
    std::thread::Builder::new()
        .name("channel-in".into())
        .spawn(move || read_in(host_in, chunks))?;
    std::thread::Builder::new()
        .name("channel-out".into())
        .spawn(move || write_out(frames, host))?;
    Ok(Threaded {
        input: ChunkReader::new(received),
        output,
    })
}

/// Queues what `host` sends, a read at a time, until it ends or fails
/// (then the queue closes: the session reads the end of the stream) or the
/// session stops reading (then the queue is gone).
fn read_in(mut host: UnixStream, chunks: mpsc::Sender<Vec<u8>>) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let n = match host.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if chunks.blocking_send(buffer[..n].to_vec()).is_err() {
            // Nobody reads on: the other way learns it from its own end.
            let _ = host.shutdown(Shutdown::Read);
            return;
        }
    }
}

/// Writes each queued frame to `host` whole, until the queue closes (then
/// the host reads the end of the stream) or a write fails (then the queue
/// is dropped, so the session's next send fails).
fn write_out(mut frames: mpsc::Receiver<Vec<u8>>, mut host: UnixStream) {
    while let Some(frame) = frames.blocking_recv() {
        if host.write_all(&frame).is_err() {
            return;
        }
    }
    let _ = host.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_the_end_of_the_stream_go_through_both_ways() {
        let (mut host, agent_side) = UnixStream::pair().unwrap();
        let Threaded {
            input: mut session,
            output,
        } = through_threads(agent_side).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // Bytes come in in order, across chunks, however the reads fall.
        let upload: Vec<u8> = (0..(1u32 << 20) + 13).map(|i| (i % 251) as u8).collect();
        let sent = upload.clone();
        let mut sender = host.try_clone().unwrap();
        let writer = std::thread::spawn(move || sender.write_all(&sent).unwrap());
        let mut got = vec![0u8; upload.len()];
        runtime
            .block_on(tokio::io::AsyncReadExt::read_exact(&mut session, &mut got))
            .unwrap();
        writer.join().unwrap();
        assert!(got == upload, "the upload came in changed");
        // Frames go out whole and in order, however large.
        let big = vec![7u8; 3 << 20];
        output.blocking_send(big.clone()).unwrap();
        output.blocking_send(b"after".to_vec()).unwrap();
        let mut back = vec![0u8; big.len() + 5];
        host.read_exact(&mut back).unwrap();
        assert_eq!(&back[..big.len()], &big[..]);
        assert_eq!(&back[big.len()..], b"after");
        // The host goes away: the session reads the end of the stream.
        host.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        runtime
            .block_on(tokio::io::AsyncReadExt::read_to_end(
                &mut session,
                &mut rest,
            ))
            .unwrap();
        assert!(rest.is_empty());
        // The session ends: the host reads the end of the stream.
        drop(output);
        let mut rest = Vec::new();
        host.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn a_host_gone_makes_the_sessions_sends_fail() {
        let (host, agent_side) = UnixStream::pair().unwrap();
        let Threaded { input, output } = through_threads(agent_side).unwrap();
        drop(host);
        // The first write may still land in the socket's buffer; a write
        // to a peer that is gone fails soon after, and the queue closes.
        let gone = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            output.blocking_send(vec![1u8; 4096]).is_err()
        });
        assert!(gone, "sends kept succeeding to a host that is gone");
        drop(input);
    }
}
