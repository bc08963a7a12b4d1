//! `connect` (protocol version 5): ports on the loopback reached through the
//! agent stream, with the host's `tunnel::open` on the other end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_agent::{serve, AgentConfig};
use airlock_protocol::tunnel::{self, TunnelError};
use airlock_protocol::{AgentClient, ErrorKind, Event, Request};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

async fn client() -> (AgentClient, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let (host, agent) = std::os::unix::net::UnixStream::pair().unwrap();
    let config = AgentConfig {
        keepalive: Duration::from_secs(30),
        drop_privileges: false,
        user_home: home.path().to_path_buf(),
        root_home: home.path().to_path_buf(),
        sudo_socket: None,
    };
    std::thread::spawn(move || {
        let _ = serve(config, agent);
    });
    host.set_nonblocking(true).unwrap();
    let stream = tokio::net::UnixStream::from_std(host).unwrap();
    (AgentClient::connect(stream, 1).await.unwrap(), home)
}

/// An echo server on loopback that upper-cases nothing: it sends back what
/// it reads, then closes when its peer does.
async fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = socket.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn bytes_go_both_ways_and_end_with_a_half_close() {
    let (client, _home) = client().await;
    let port = echo_server().await;
    let mut stream = tunnel::open(&client, &tunnel::Registry::default(), port)
        .await
        .unwrap();
    let sent: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = tokio::io::split(&mut stream);
    let writer = async {
        w.write_all(&sent).await.unwrap();
        // Our end of file reaches the server, which then closes.
        w.shutdown().await.unwrap();
    };
    let mut got = Vec::new();
    let reader = tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut got));
    let ((), read) = tokio::join!(writer, reader);
    read.unwrap().unwrap();
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "the echo differs from what was sent");
}

#[tokio::test]
async fn a_port_nothing_listens_on_is_refused() {
    let (client, _home) = client().await;
    let port = closed_port().await;
    match tunnel::open(&client, &tunnel::Registry::default(), port).await {
        Err(TunnelError::Refused(p)) => assert_eq!(p, port),
        other => panic!("expected refused, got {:?}", other.map(|_| ())),
    }
    // Port 0 is not a port.
    let answer = client
        .request(Request::Connect { port: 0 })
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            Event::Error {
                kind: ErrorKind::InvalidArgument,
                ..
            }
        ),
        "{answer:?}"
    );
}

#[tokio::test]
async fn many_connections_at_once_stay_apart() {
    let (client, _home) = client().await;
    let port = echo_server().await;
    let jobs: Vec<_> = (0..32)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut stream = tunnel::open(&client, &tunnel::Registry::default(), port)
                    .await
                    .unwrap();
                let line = format!("connection {i}\n").repeat(200);
                stream.write_all(line.as_bytes()).await.unwrap();
                stream.shutdown().await.unwrap();
                let mut got = String::new();
                stream.read_to_string(&mut got).await.unwrap();
                assert_eq!(got, line);
            })
        })
        .collect();
    for job in jobs {
        tokio::time::timeout(Duration::from_secs(20), job)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn a_server_that_closes_first_ends_the_stream() {
    let (client, _home) = client().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.write_all(b"hello and goodbye").await.unwrap();
    });
    let mut stream = tunnel::open(&client, &tunnel::Registry::default(), port)
        .await
        .unwrap();
    let mut got = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, "hello and goodbye");
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection_inside() {
    let (client, _home) = client().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stream = tunnel::open(&client, &tunnel::Registry::default(), port)
        .await
        .unwrap();
    let (mut inside, _) = listener.accept().await.unwrap();
    drop(stream);
    // The server sees end of file, as from a client that went away.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), inside.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    drop(inside);
    // The agent forgot it: the stream still serves new connections.
    let port = echo_server().await;
    let mut again = tunnel::open(&client, &tunnel::Registry::default(), port)
        .await
        .unwrap();
    again.write_all(b"still here").await.unwrap();
    let mut buf = [0u8; 10];
    again.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"still here");
}

#[tokio::test]
async fn a_cancelled_connection_ends_at_once() {
    let (client, _home) = client().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut events = client.request(Request::Connect { port }).await.unwrap();
    let id = events.id();
    assert_eq!(events.next().await.unwrap().unwrap().msg, Event::Connected);
    let (mut inside, _) = listener.accept().await.unwrap();
    let cancel = client
        .request(Request::Cancel { target: id })
        .await
        .unwrap();
    assert_eq!(cancel.finish().await.unwrap(), Event::Done);
    assert_eq!(events.finish().await.unwrap(), Event::Done);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), inside.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn closing_the_registry_closes_every_connection_at_the_agent_first() {
    let (client, _home) = client().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let registry = tunnel::Registry::default();
    let mut streams = Vec::new();
    let mut inside = Vec::new();
    for _ in 0..3 {
        streams.push(tunnel::open(&client, &registry, port).await.unwrap());
        inside.push(listener.accept().await.unwrap().0);
    }
    assert_eq!(registry.len(), 3);
    // The callers still hold their streams: the registry closes them anyway.
    tokio::time::timeout(Duration::from_secs(10), registry.close_all())
        .await
        .unwrap();
    assert!(registry.is_empty(), "{} still open", registry.len());
    for mut socket in inside {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty());
    }
    // A caller's stream reads end of file.
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), streams[0].read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_empty());
}
