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
//! threads. One reads it and writes what it read into a socket pair of the
//! sandbox's own kernel (saved and restored whole with it), whose other end
//! the session reads as it would the channel. The other takes the
//! session's encoded frames from an in-memory queue and writes each to the
//! channel whole: no second trip through the sandbox's kernel on the way
//! out, where the bulk of the bytes go (command output, file reads, a
//! forwarded port's answers; on gVisor every such trip is a copy in and
//! out of its kernel, billed to the sandbox's CPU limit). End of stream
//! goes through in both ways.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use tokio::sync::mpsc;

/// Bytes moved per read on the way in.
const CHUNK: usize = 256 * 1024;
/// Encoded frames that may wait for the writing thread (each at most a
/// frame's limit; the session's own queue holds the rest).
const OUT_FRAMES: usize = 4;

/// The session's side of a channel served by threads.
#[derive(Debug)]
pub struct Threaded {
    /// What the host sent, in order; reads the end of the stream once the
    /// host's side ended.
    pub(crate) input: UnixStream,
    /// Whole encoded frames for the host, written in order. Sending fails
    /// once the host is gone; dropping it ends the host's stream.
    pub(crate) output: mpsc::Sender<Vec<u8>>,
}

/// Returns the side the session serves; `host` is then served by two
/// threads of this process.
pub fn through_threads(host: UnixStream) -> std::io::Result<Threaded> {
    host.set_nonblocking(false)?;
    let (session_end, pumped_end) = UnixStream::pair()?;
    let host_in = host.try_clone()?;
    let (output, frames) = mpsc::channel(OUT_FRAMES);
    std::thread::Builder::new()
        .name("channel-in".into())
        .spawn(move || pump(host_in, pumped_end))?;
    std::thread::Builder::new()
        .name("channel-out".into())
        .spawn(move || write_out(frames, host))?;
    Ok(Threaded {
        input: session_end,
        output,
    })
}

/// Copies `from` to `to` until `from` ends or either fails; then tells
/// `to`'s reader there is no more.
fn pump(mut from: UnixStream, mut to: UnixStream) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if to.write_all(&buffer[..n]).is_err() {
            // Nobody reads on: the other way learns it from its own end.
            let _ = from.shutdown(Shutdown::Read);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
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
        host.write_all(b"request").unwrap();
        let mut got = [0u8; 7];
        session.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"request");
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
        session.read_to_end(&mut rest).unwrap();
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
