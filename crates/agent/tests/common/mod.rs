//! A small host-side client for driving `serve` over a socketpair.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use airlock_agent::{serve, AgentConfig, AgentError};
use airlock_protocol::{
    read_frame, write_frame, Event, ExitStatus, Frame, Identity, ProcessLimits, PtySize, Request,
    SpawnRequest,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::BufReader;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// How long any single event may take before a test fails.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// An agent served on a thread, and the host end of its stream.
pub struct Agent {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    stash: HashMap<u64, VecDeque<Frame<Event>>>,
    next_id: u64,
    thread: Option<JoinHandle<Result<(), AgentError>>>,
    pub home: tempfile::TempDir,
    pub keepalives: usize,
}

/// What a finished process produced.
#[derive(Debug)]
pub struct Output {
    pub pid: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// What the process's terminal showed (`pty` events).
    pub pty: Vec<u8>,
    pub status: ExitStatus,
}

/// A spawn request for `cmd args` with a plain PATH.
pub fn command(cmd: &str, args: &[&str]) -> SpawnRequest {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned());
    SpawnRequest {
        cmd: cmd.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env,
        cwd: None,
        user: Identity::User,
        stdin: false,
        pty: None,
        timeout_ms: None,
        output_limit: 1 << 20,
        limits: ProcessLimits {
            nofile: 1024,
            fsize_bytes: 1 << 30,
        },
    }
}

/// A spawn request for `sh -c script`.
pub fn sh(script: &str) -> SpawnRequest {
    command("sh", &["-c", script])
}

/// `spawn` on a new terminal of `cols` x `rows`.
pub fn on_terminal(mut spawn: SpawnRequest, cols: u16, rows: u16) -> SpawnRequest {
    spawn.pty = Some(PtySize { cols, rows });
    spawn
}

impl Agent {
    /// Starts `serve` on a thread with a fresh temporary home.
    pub fn start() -> Agent {
        Agent::start_with(Duration::from_secs(30))
    }

    /// Starts `serve` with the given keepalive interval.
    pub fn start_with(keepalive: Duration) -> Agent {
        let home = tempfile::tempdir().unwrap();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let config = AgentConfig {
            keepalive,
            drop_privileges: false,
            user_home: home.path().to_path_buf(),
            root_home: home.path().to_path_buf(),
            sudo_socket: None,
        };
        let thread = std::thread::spawn(move || serve(config, theirs));
        let mut agent = Agent::connect(ours, home);
        agent.thread = Some(thread);
        agent
    }

    /// A client on the host end of a stream whose agent runs elsewhere.
    pub fn connect(ours: std::os::unix::net::UnixStream, home: tempfile::TempDir) -> Agent {
        ours.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        let (reader, writer) = stream.into_split();
        Agent {
            reader: BufReader::new(reader),
            writer,
            stash: HashMap::new(),
            next_id: 1,
            thread: None,
            home,
            keepalives: 0,
        }
    }

    /// Reads (and stashes) events until the agent closes the stream.
    pub async fn wait_closed(&mut self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let frame = tokio::time::timeout_at(deadline, read_frame::<_, Event>(&mut self.reader))
                .await
                .expect("the agent did not close the stream in time");
            match frame {
                Ok(frame) => self.stash.entry(frame.id).or_default().push_back(frame),
                Err(_) => return,
            }
        }
    }

    /// The absolute path of `name` in the home.
    pub fn path(&self, name: &str) -> String {
        self.home.path().join(name).to_string_lossy().into_owned()
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// Sends a request with a fresh id.
    pub async fn send(&mut self, request: Request) -> u64 {
        self.send_payload(request, Vec::new()).await
    }

    /// Sends a request with payload and a fresh id.
    pub async fn send_payload(&mut self, request: Request, payload: Vec<u8>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_on(id, request, payload).await;
        id
    }

    /// Sends a frame on a given id.
    pub async fn send_on(&mut self, id: u64, request: Request, payload: Vec<u8>) {
        write_frame(&mut self.writer, &Frame::with_payload(id, request, payload))
            .await
            .unwrap();
    }

    /// Writes raw bytes to the stream.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.writer.write_all(bytes).await.unwrap();
    }

    /// The next event of request `id`.
    pub async fn next(&mut self, id: u64) -> Frame<Event> {
        if let Some(frame) = self.stash.get_mut(&id).and_then(VecDeque::pop_front) {
            return frame;
        }
        loop {
            let frame: Frame<Event> =
                tokio::time::timeout(EVENT_TIMEOUT, read_frame(&mut self.reader))
                    .await
                    .unwrap_or_else(|_| panic!("no event for request {id} in time"))
                    .unwrap();
            if frame.id == 0 {
                assert_eq!(frame.msg, Event::Keepalive);
                self.keepalives += 1;
                continue;
            }
            if frame.id == id {
                return frame;
            }
            self.stash.entry(frame.id).or_default().push_back(frame);
        }
    }

    /// The next frame on the wire of any request (keepalives are counted and
    /// skipped), for tests of the order across requests. Every stashed frame
    /// must have been taken first.
    pub async fn next_any(&mut self) -> Frame<Event> {
        assert!(
            self.stash.values().all(VecDeque::is_empty),
            "frames are stashed: {:?}",
            self.stash
        );
        loop {
            let frame: Frame<Event> =
                tokio::time::timeout(EVENT_TIMEOUT, read_frame(&mut self.reader))
                    .await
                    .unwrap_or_else(|_| panic!("no event in time"))
                    .unwrap();
            if frame.id == 0 {
                assert_eq!(frame.msg, Event::Keepalive);
                self.keepalives += 1;
                continue;
            }
            return frame;
        }
    }

    /// Every event of request `id` up to and including the final one.
    pub async fn finish(&mut self, id: u64) -> Vec<Frame<Event>> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next(id).await;
            let last = frame.msg.is_final();
            frames.push(frame);
            if last {
                return frames;
            }
        }
    }

    /// Sends a request and returns its final event (asserting there is no other).
    pub async fn call(&mut self, request: Request) -> Event {
        let id = self.send(request).await;
        let mut frames = self.finish(id).await;
        assert_eq!(frames.len(), 1, "{frames:?}");
        frames.pop().unwrap().msg
    }

    /// Collects a spawned process's output and status.
    pub async fn collect(&mut self, id: u64) -> Output {
        let first = self.next(id).await;
        let Event::Started { pid } = first.msg else {
            panic!("expected started, got {:?}", first.msg);
        };
        let mut out = Output {
            pid,
            stdout: Vec::new(),
            stderr: Vec::new(),
            pty: Vec::new(),
            status: ExitStatus {
                pid: 0,
                code: None,
                signal: None,
                oom: false,
                timed_out: false,
                stdout_truncated: false,
                stderr_truncated: false,
            },
        };
        loop {
            let frame = self.next(id).await;
            match frame.msg {
                Event::Stdout => {
                    assert!(frame.payload.len() <= 64 * 1024);
                    out.stdout.extend_from_slice(&frame.payload);
                }
                Event::Stderr => {
                    assert!(frame.payload.len() <= 64 * 1024);
                    out.stderr.extend_from_slice(&frame.payload);
                }
                Event::Pty => {
                    assert!(frame.payload.len() <= 64 * 1024);
                    out.pty.extend_from_slice(&frame.payload);
                }
                Event::Exited(status) => {
                    assert_eq!(status.pid, pid);
                    out.status = status;
                    return out;
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
    }

    /// Spawns and collects.
    pub async fn run(&mut self, spawn: SpawnRequest) -> Output {
        let id = self.send(Request::Spawn(spawn)).await;
        self.collect(id).await
    }

    /// Spawns and returns the request id and the pid from `started`.
    pub async fn start_process(&mut self, spawn: SpawnRequest) -> (u64, u32) {
        let id = self.send(Request::Spawn(spawn)).await;
        match self.next(id).await.msg {
            Event::Started { pid } => (id, pid),
            other => panic!("expected started, got {other:?}"),
        }
    }

    /// Closes the host end and waits for `serve` to return.
    pub async fn close(mut self) -> Result<(), AgentError> {
        let thread = self.thread.take();
        drop(self);
        match thread {
            Some(thread) => tokio::task::spawn_blocking(move || thread.join().unwrap())
                .await
                .unwrap(),
            None => Ok(()),
        }
    }
}

/// Whether a process with this pid exists (zombies count).
pub fn alive(pid: u32) -> bool {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::test_kill_process(pid).is_ok()
}
