//! Reaching a sandbox's loopback from the host: a TCP connection made
//! inside the sandbox's network namespace, to a port one of its processes
//! listens on, for the daemon to carry traffic from outside to it without
//! a hop through the sandbox's agent.
//!
//! The namespace is entered by a thread of its own that makes the one
//! connection and ends: no other thread of the caller ever runs in it,
//! and the connection (a socket belongs to the namespace it was made in)
//! stays there. Only loopback addresses are dialled, so a connection
//! reaches nothing the sandbox's own processes could not. A namespace
//! that is the caller's own is refused: this never reaches the host's
//! loopback.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// Why a connection to a sandbox's loopback was not made.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("nothing listens on port {port} on the sandbox's loopback")]
    Refused { port: u16 },
    #[error("port {port} did not accept the connection in time")]
    Timeout { port: u16 },
    #[error("the namespace is this process's own, not a sandbox's")]
    OwnNamespace,
    #[error("cannot enter the sandbox's network namespace")]
    Enter(#[source] std::io::Error),
    #[error("cannot connect to port {port} on the sandbox's loopback")]
    Connect {
        port: u16,
        #[source]
        source: std::io::Error,
    },
}

/// A sandbox's network namespace, opened once while the sandbox is known
/// to be alive (a path by pid could name another process's later).
#[derive(Debug)]
pub struct LoopbackNamespace {
    fd: OwnedFd,
    /// Its identity (the nsfs device and inode).
    id: (u64, u64),
}

impl LoopbackNamespace {
    /// The network namespace of process `pid`; `None` when it cannot be
    /// opened or is the caller's own.
    pub fn of_process(pid: u32) -> Option<LoopbackNamespace> {
        let file = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
        let meta = file.metadata().ok()?;
        let namespace = LoopbackNamespace {
            fd: file.into(),
            id: (meta.dev(), meta.ino()),
        };
        (!namespace.is_own()).then_some(namespace)
    }

    /// Whether it is the calling thread's own network namespace (or that
    /// cannot be told).
    fn is_own(&self) -> bool {
        std::fs::metadata("/proc/thread-self/ns/net")
            .map_or(true, |own| (own.dev(), own.ino()) == self.id)
    }

    /// Connects to `port` on its loopback, IPv4 first, then IPv6, within
    /// `timeout` each (blocking: a thread is started and joined).
    pub fn dial(&self, port: u16, timeout: Duration) -> Result<TcpStream, DialError> {
        if self.is_own() {
            return Err(DialError::OwnNamespace);
        }
        let namespace = self.fd.try_clone().map_err(DialError::Enter)?;
        let dialler = std::thread::Builder::new()
            .name("loopback-dial".into())
            .spawn(move || -> Result<TcpStream, DialError> {
                rustix::thread::move_into_link_name_space(
                    namespace.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| DialError::Enter(e.into()))?;
                drop(namespace);
                let mut refused = None;
                for ip in [Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()] {
                    match TcpStream::connect_timeout(&SocketAddr::new(ip, port), timeout) {
                        Ok(stream) => return Ok(stream),
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                            return Err(DialError::Timeout { port })
                        }
                        Err(e) => refused = Some(e),
                    }
                }
                Err(match refused {
                    Some(e)
                        if e.kind() != std::io::ErrorKind::ConnectionRefused
                            && e.kind() != std::io::ErrorKind::AddrNotAvailable =>
                    {
                        DialError::Connect { port, source: e }
                    }
                    _ => DialError::Refused { port },
                })
            })
            .map_err(DialError::Enter)?;
        dialler.join().unwrap_or_else(|_| {
            Err(DialError::Enter(std::io::Error::other(
                "the dialling thread panicked",
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_own_namespace_is_refused() {
        assert!(LoopbackNamespace::of_process(std::process::id()).is_none());
    }

    #[test]
    fn a_connection_is_made_in_the_namespace_and_only_there() {
        if !rustix::process::geteuid().is_root() {
            panic!("this test needs root (it makes a network namespace)");
        }
        // A process in a namespace of its own, loopback up, listening.
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "sh", "-c", "ip link set lo up && exec python3 -c \"import socket,sys\ns=socket.socket(); s.bind(('127.0.0.1', 7999)); s.listen(); print('up', flush=True); c,_=s.accept(); c.sendall(b'inside'); c.close()\""])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "up\n");
        let namespace = LoopbackNamespace::of_process(child.id()).unwrap();
        // Not on the host's loopback: nothing listens there on that port.
        assert!(std::net::TcpStream::connect(("127.0.0.1", 7999)).is_err());
        let mut stream = namespace.dial(7999, Duration::from_secs(5)).unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut stream, &mut got).unwrap();
        assert_eq!(got, "inside");
        // The caller's thread never moved.
        assert!(LoopbackNamespace::of_process(std::process::id()).is_none());
        assert!(matches!(
            namespace.dial(7998, Duration::from_secs(5)),
            Err(DialError::Refused { port: 7998 })
        ));
        child.wait().unwrap();
    }
}
