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
//! [`through_threads`] therefore moves the bytes between the host channel
//! and a socket pair of the sandbox's own kernel (saved and restored whole
//! with it) in two blocking threads; the session serves the pair's other
//! end as it would the channel. End of stream goes through in both ways.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;

/// Bytes moved per read.
const CHUNK: usize = 64 * 1024;

/// Returns the end the session serves; `host` is then pumped by two
/// threads of this process.
pub fn through_threads(host: UnixStream) -> std::io::Result<UnixStream> {
    host.set_nonblocking(false)?;
    let (session_end, pumped_end) = UnixStream::pair()?;
    let host_in = host.try_clone()?;
    let pumped_out = pumped_end.try_clone()?;
    std::thread::Builder::new()
        .name("channel-in".into())
        .spawn(move || pump(host_in, pumped_end))?;
    std::thread::Builder::new()
        .name("channel-out".into())
        .spawn(move || pump(pumped_out, host))?;
    Ok(session_end)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_the_end_of_the_stream_go_through_both_ways() {
        let (mut host, agent_side) = UnixStream::pair().unwrap();
        let mut session = through_threads(agent_side).unwrap();
        host.write_all(b"request").unwrap();
        let mut got = [0u8; 7];
        session.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"request");
        let big = vec![7u8; 1 << 20];
        let writer = {
            let mut session = session.try_clone().unwrap();
            let big = big.clone();
            std::thread::spawn(move || session.write_all(&big).unwrap())
        };
        let mut back = vec![0u8; big.len()];
        host.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        assert_eq!(back, big);
        // The host goes away: the session reads the end of the stream.
        host.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        session.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        // The session ends: the host reads the end of the stream.
        session.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        host.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
}
