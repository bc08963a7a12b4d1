//! What the `sudo` shim and the agent say to each other: one JSON message
//! per `SOCK_SEQPACKET` datagram, on an abstract Unix socket.
//!
//! 1. shim → agent: [`Ask`], with the shim's stdin, stdout and stderr as
//!    `SCM_RIGHTS` descriptors;
//! 2. agent → shim: [`Reply::Started`] or [`Reply::Refused`] (and the
//!    connection ends);
//! 3. shim → agent, any number of times: [`Tell::Signal`];
//! 4. agent → shim: [`Reply::Exited`] once the command has ended.

use airlock_protocol::Identity;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use tokio::io::unix::AsyncFd;

/// The abstract socket name the agent listens on.
pub const SOCKET_NAME: &str = "airlock-sudo";

/// Largest message either side sends (the command line and environment of
/// an [`Ask`] included).
pub(crate) const MAX_MESSAGE: usize = 128 << 10;
/// The largest message after the ask (a `Tell`); a longer one is refused.
const MAX_TELL: usize = 1024;

/// Signals a shim relays to its command.
pub(crate) const RELAYED: [i32; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGALRM,
    libc::SIGCONT,
];

/// A command to run: everything resolved by the shim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ask {
    /// Looked up in `PATH` of `env` when it has no `/`.
    pub program: String,
    pub args: Vec<String>,
    /// Exactly the command's environment.
    pub env: Vec<(String, String)>,
    /// Absolute; anything else means the identity's home.
    pub cwd: String,
    pub user: Identity,
    /// The caller's own limits, which the command keeps.
    pub nofile: u64,
    pub fsize_bytes: u64,
}

/// The agent's answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Reply {
    Started,
    /// Not started; `message` is what sudo prints.
    Refused {
        message: String,
    },
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// What the shim tells a running command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "tell", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Tell {
    Signal { signal: i32 },
}

fn address(name: &str) -> io::Result<SocketAddrUnix> {
    Ok(SocketAddrUnix::new_abstract_name(name.as_bytes())?)
}

fn socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let flags = if nonblocking {
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK
    } else {
        SocketFlags::CLOEXEC
    };
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags,
        None,
    )?)
}

/// A non-blocking listener on the abstract `name`.
pub(crate) fn listen(name: &str) -> io::Result<OwnedFd> {
    let fd = socket(true)?;
    rustix::net::bind(&fd, &address(name)?)?;
    rustix::net::listen(&fd, 64)?;
    Ok(fd)
}

/// A blocking connection to the abstract `name`.
pub(crate) fn connect(name: &str) -> io::Result<OwnedFd> {
    let fd = socket(false)?;
    rustix::net::connect(&fd, &address(name)?)?;
    Ok(fd)
}

/// The pid and uid of the process at the other end (`SO_PEERCRED`); pid 0
/// when it lives outside this pid namespace.
pub(crate) fn peer(fd: BorrowedFd<'_>) -> io::Result<(i32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a local of
    // exactly that size, and the new length into `len`.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid))
}

/// Encodes `message`, refusing one over [`MAX_MESSAGE`].
fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let bytes = serde_json::to_vec(message).map_err(io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the message is too large",
        ));
    }
    Ok(bytes)
}

/// One datagram and up to three descriptors; `Ok(None)` at end of stream.
fn receive_raw(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        fd,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if received
        .flags
        .intersects(rustix::net::ReturnFlags::TRUNC | rustix::net::ReturnFlags::CTRUNC)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the message is too large",
        ));
    }
    if received.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((received.bytes, fds)))
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Entry points for `fuzz/` (the `sudo_wire` target): what the agent makes
/// of a datagram any process in the sandbox may send.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::{decode, encode, Ask, Tell, MAX_MESSAGE, MAX_TELL};
    use serde::{Deserialize, Serialize};

    /// Decodes `bytes` as the agent decodes an ask (a caller's first
    /// datagram, at most [`MAX_MESSAGE`] bytes) and as a later `Tell` (at
    /// most [`MAX_TELL`]); whatever decodes must encode and decode back to
    /// itself.
    pub fn datagram(bytes: &[u8]) {
        round_trip::<Ask>(&bytes[..bytes.len().min(MAX_MESSAGE)]);
        round_trip::<Tell>(&bytes[..bytes.len().min(MAX_TELL)]);
    }

    fn round_trip<T>(bytes: &[u8])
    where
        T: for<'de> Deserialize<'de> + Serialize + PartialEq + std::fmt::Debug,
    {
        if let Ok(message) = decode::<T>(bytes) {
            let again = encode(&message).and_then(|encoded| decode::<T>(&encoded));
            assert_eq!(
                again.ok().as_ref(),
                Some(&message),
                "a message changed on a round trip"
            );
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the other end closed")
}

// ---- the agent's side (non-blocking, on tokio) ----

/// Registers a non-blocking socket with the runtime.
pub(crate) fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the `OwnedFd`, whose descriptor stays open
    // and unchanged until the `AsyncFd` drops (deregistering first); an
    // `OwnedFd` always returns the same raw descriptor.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// Waits for and accepts one caller.
pub(crate) async fn accept(listener: &AsyncFd<OwnedFd>) -> io::Result<OwnedFd> {
    loop {
        let mut guard = listener.readable().await?;
        match guard.try_io(|fd| {
            Ok(rustix::net::accept_with(
                fd.get_ref(),
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            )?)
        }) {
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

async fn receive_async(
    conn: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        let mut guard = conn.readable().await?;
        match guard.try_io(|fd| receive_raw(fd.get_ref().as_fd(), buf)) {
            Ok(Ok(Some(received))) => return Ok(received),
            Ok(Ok(None)) => return Err(closed()),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// The first message of a caller: an [`Ask`] and its three descriptors;
/// the error is the refusal sudo prints.
pub(crate) async fn receive_ask(conn: &AsyncFd<OwnedFd>) -> Result<(Ask, [OwnedFd; 3]), String> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (len, fds) = receive_async(conn, &mut buf)
        .await
        .map_err(|_| "sudo: the request could not be read".to_owned())?;
    let ask: Ask = decode(&buf[..len])
        .map_err(|_| "sudo: the request is not one this agent understands".to_owned())?;
    let stdio: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| "sudo: the request must carry stdin, stdout and stderr".to_owned())?;
    Ok((ask, stdio))
}

/// The next message of a caller.
pub(crate) async fn receive<T: for<'de> Deserialize<'de>>(
    conn: &AsyncFd<OwnedFd>,
) -> io::Result<T> {
    let mut buf = [0u8; MAX_TELL];
    let (len, _fds) = receive_async(conn, &mut buf).await?;
    decode(&buf[..len])
}

/// Sends one message.
pub(crate) async fn send<T: Serialize>(conn: &AsyncFd<OwnedFd>, message: &T) -> io::Result<()> {
    let bytes = encode(message)?;
    loop {
        let mut guard = conn.writable().await?;
        match guard.try_io(|fd| {
            Ok(rustix::net::send(
                fd.get_ref(),
                &bytes,
                SendFlags::NOSIGNAL,
            )?)
        }) {
            Ok(result) => return result.map(|_| ()),
            Err(_would_block) => continue,
        }
    }
}

// ---- the shim's side (blocking) ----

/// Sends `ask` with `stdio` as its descriptors.
pub(crate) fn send_ask(
    conn: BorrowedFd<'_>,
    ask: &Ask,
    stdio: [BorrowedFd<'_>; 3],
) -> io::Result<()> {
    let bytes = encode(ask)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&stdio)) {
        return Err(io::Error::other("the descriptors do not fit"));
    }
    rustix::net::sendmsg(
        conn,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Sends a [`Tell`].
pub(crate) fn tell(conn: BorrowedFd<'_>, message: &Tell) -> io::Result<()> {
    let bytes = encode(message)?;
    rustix::net::send(conn, &bytes, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Reads the next [`Reply`], blocking.
pub(crate) fn reply(conn: BorrowedFd<'_>) -> io::Result<Reply> {
    let mut buf = vec![0u8; 8192];
    match receive_raw(conn, &mut buf)? {
        Some((len, _fds)) => decode(&buf[..len]),
        None => Err(closed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_the_documented_shape() {
        let started = serde_json::to_string(&Reply::Started).unwrap();
        assert_eq!(started, r#"{"reply":"started"}"#);
        let exited = serde_json::to_string(&Reply::Exited {
            code: Some(3),
            signal: None,
        })
        .unwrap();
        assert_eq!(exited, r#"{"reply":"exited","code":3,"signal":null}"#);
        let tell = serde_json::to_string(&Tell::Signal { signal: 2 }).unwrap();
        assert_eq!(tell, r#"{"tell":"signal","signal":2}"#);
        assert!(decode::<Ask>(br#"{"program":"x","extra":1}"#).is_err());
    }

    #[test]
    fn an_ask_over_the_limit_is_refused_before_it_is_sent() {
        let ask = Ask {
            program: "true".into(),
            args: vec!["x".repeat(MAX_MESSAGE)],
            env: Vec::new(),
            cwd: "/".into(),
            user: Identity::Root,
            nofile: 1024,
            fsize_bytes: u64::MAX,
        };
        assert!(encode(&ask).is_err());
    }
}
