//! Strangers cannot stall the daemon: idle and slow connections are
//! capped, timed out and evicted, so authenticated clients keep being
//! served. Needs root (the daemon raises its descriptor limit) and
//! util-linux's `prlimit`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn address(daemon: &TestDaemon) -> String {
    daemon.url.trim_start_matches("http://").to_owned()
}

/// A process holding `n` connections to `target` open and idle until it
/// is killed (this process's descriptor limit may be below 20,000).
fn hold_connections(target: &str, n: usize) -> std::process::Child {
    let (host, port) = target.rsplit_once(':').unwrap();
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "import socket, sys, time\n\
             held = [socket.create_connection((sys.argv[1], int(sys.argv[2]))) for _ in range(int(sys.argv[3]))]\n\
             print('held', flush=True)\n\
             time.sleep(600)",
            host,
            port,
            &n.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "held\n", "the holder could not open {n} connections");
    child
}

/// 20,000 idle connections from the client's own address, against a
/// daemon started with a descriptor limit of 4,096 (so it caps itself):
/// authenticated clients still create, run and delete, and the daemon
/// holds no more connections than its cap.
#[test]
fn twenty_thousand_idle_connections_do_not_lock_out_clients() {
    let daemon = TestDaemon::start_under(&["prlimit", "--nofile=4096:4096", "--"], &[]);
    let target = address(&daemon);
    let started = Instant::now();
    let mut holders: Vec<_> = (0..2).map(|_| hold_connections(&target, 10_000)).collect();
    eprintln!("20,000 connections opened in {:?}", started.elapsed());

    // An authenticated client is served: its connection makes room.
    let created = daemon.create(json!({}));
    let id = created["id"].as_str().unwrap();
    let (out, code) = daemon.sh_out(id, "echo served");
    assert_eq!((out.as_str(), code), ("served\n", 0));
    assert_eq!(daemon.call("GET", "/healthz", None).status, 200);
    // Half of its 4,096 descriptors are for connections.
    let open = daemon.metric("airlock_http_connections");
    assert!(open <= 2048.0, "{open} connections held");
    assert!(daemon.metric("airlock_http_connections_evicted_total") > 0.0);
    daemon.delete_all();
    for holder in &mut holders {
        let _ = holder.kill();
        let _ = holder.wait();
    }
}

/// Clients that send their request head a byte at a time are closed at
/// the header timeout.
#[test]
fn slowloris_clients_are_closed_at_the_header_timeout() {
    let daemon = TestDaemon::start(&["--header-timeout", "2s"]);
    let target = address(&daemon);
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut stream = TcpStream::connect(&target).unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
                .unwrap();
            stream.set_nonblocking(true).unwrap();
            stream
        })
        .collect();
    let started = Instant::now();
    let mut closed = vec![false; slow.len()];
    while closed.iter().any(|c| !c) && started.elapsed() < Duration::from_secs(20) {
        for (stream, closed) in slow.iter_mut().zip(closed.iter_mut()) {
            if *closed {
                continue;
            }
            // One more byte of the head, never its end.
            let _ = stream.write(b"a");
            let mut buf = [0u8; 1024];
            match stream.read(&mut buf) {
                Ok(_) => *closed = true, // an answer (408) or EOF: it is done
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *closed = true,
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let still_open = closed.iter().filter(|c| !**c).count();
    assert_eq!(
        still_open,
        0,
        "slow clients still held after {:?}",
        started.elapsed()
    );
    assert_eq!(daemon.call("GET", "/healthz", None).status, 200);
}

/// When every connection under the cap serves an authenticated request,
/// a new one is refused with a clear answer instead of hanging.
#[test]
fn past_the_cap_with_nothing_to_evict_a_connection_is_refused_clearly() {
    let daemon = TestDaemon::start(&["--max-connections", "4", "--max-connections-per-peer", "4"]);
    let created = daemon.create(json!({}));
    let id = created["id"].as_str().unwrap().to_owned();
    // Four authenticated exec streams that last a while.
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let url = format!("{}/v1/sandboxes/{id}/exec", daemon.url);
            let key = daemon.key.clone();
            std::thread::spawn(move || {
                ureq::post(url)
                    .header("X-API-Key", &key)
                    .content_type("application/json")
                    .send(json!({"cmd": "sleep", "args": ["6"]}).to_string())
                    .map(|r| {
                        let status = r.status().as_u16();
                        // The stream lasts as long as the process.
                        let _ = r.into_body().read_to_string();
                        status
                    })
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let mut stranger = TcpStream::connect(address(&daemon)).unwrap();
    stranger
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = String::new();
    if let Err(e) = stranger.read_to_string(&mut answer) {
        panic!(
            "no refusal ({e}); the daemon's log:\n{}",
            daemon.log.lock().unwrap()
        );
    }
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    for stream in busy {
        assert_eq!(stream.join().unwrap().unwrap(), 200);
    }
    // Once they are done, connections are taken again.
    assert_eq!(daemon.call("GET", "/healthz", None).status, 200);
    daemon.delete_all();
}
