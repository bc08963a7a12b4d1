//! The host-side `AgentClient` against a real agent: concurrent requests are
//! routed by id, and a dropped agent ends waiting requests instead of
//! hanging them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_agent::{serve, AgentConfig};
use airlock_protocol::{AgentClient, ClientError, Event, Request};
use common::sh;
use std::time::Duration;

fn start_agent() -> (
    tokio::net::UnixStream,
    tempfile::TempDir,
    std::thread::JoinHandle<()>,
) {
    let home = tempfile::tempdir().unwrap();
    let (host, agent) = std::os::unix::net::UnixStream::pair().unwrap();
    let config = AgentConfig {
        keepalive: Duration::from_millis(50),
        drop_privileges: false,
        user_home: home.path().to_path_buf(),
        root_home: home.path().to_path_buf(),
        sudo_socket: None,
    };
    let thread = std::thread::spawn(move || {
        let _ = serve(config, agent);
    });
    host.set_nonblocking(true).unwrap();
    (
        tokio::net::UnixStream::from_std(host).unwrap(),
        home,
        thread,
    )
}

async fn output_of(client: &AgentClient, script: &str) -> String {
    let mut events = client.request(Request::Spawn(sh(script))).await.unwrap();
    let mut out = Vec::new();
    while let Some(frame) = events.next().await.unwrap() {
        match frame.msg {
            Event::Stdout => out.extend_from_slice(&frame.payload),
            Event::Exited(status) => assert_eq!(status.code, Some(0)),
            _ => {}
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn concurrent_requests_are_routed_by_id() {
    let (stream, _home, thread) = start_agent();
    let client = AgentClient::connect(stream, 1000).await.unwrap();
    let jobs: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let script = format!("for n in 1 2 3; do echo job{i}-$n; sleep 0.01; done");
                (i, output_of(&client, &script).await)
            })
        })
        .collect();
    for job in jobs {
        let (i, out) = job.await.unwrap();
        assert_eq!(out, format!("job{i}-1\njob{i}-2\njob{i}-3\n"));
    }
    assert_eq!(
        client
            .request(Request::Ping)
            .await
            .unwrap()
            .finish()
            .await
            .unwrap(),
        Event::Pong
    );
    drop(client);
    // Joined off the runtime thread: the client's writer task must run to
    // shut the connection down, which is what lets the agent return.
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_vanished_agent_ends_waiting_requests() {
    use airlock_protocol::{read_frame, write_frame, Frame, PROTOCOL_VERSION};
    // A fake agent that greets, starts one process, then dies without a
    // final event: as a sandbox killed from outside would.
    let (host, mut fake) = tokio::net::UnixStream::pair().unwrap();
    let agent = tokio::spawn(async move {
        let hello: Frame<Request> = read_frame(&mut fake).await.unwrap();
        let greeting = Event::Hello {
            version: PROTOCOL_VERSION,
            agent_version: "fake".into(),
        };
        write_frame(&mut fake, &Frame::new(hello.id, greeting))
            .await
            .unwrap();
        let spawn: Frame<Request> = read_frame(&mut fake).await.unwrap();
        write_frame(&mut fake, &Frame::new(spawn.id, Event::Started { pid: 7 }))
            .await
            .unwrap();
    });
    let client = AgentClient::connect(host, 1).await.unwrap();
    let mut events = client
        .request(Request::Spawn(sh("sleep 30")))
        .await
        .unwrap();
    let started = events.next().await.unwrap().unwrap();
    assert_eq!(started.msg, Event::Started { pid: 7 });
    agent.await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the request hung after the agent went away");
    assert!(matches!(end, Err(ClientError::Closed)), "{end:?}");
    // New requests fail at once too.
    let later = client.request(Request::Ping).await;
    let ended = match later {
        Err(e) => Err(e),
        Ok(events) => events.finish().await,
    };
    assert!(matches!(ended, Err(ClientError::Closed)), "{ended:?}");
}
