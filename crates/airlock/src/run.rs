//! `airlock run`: an ephemeral sandbox for one command.

use crate::sandbox::{Prepared, Sandbox};
use airlock::net_args::NetArgs;
use airlock::{error_chain, EXIT_BAD_INPUT, EXIT_INTERNAL};
use airlock_jail::runtime::RuntimeDir;
use airlock_policy::{
    parse_cpus, parse_duration, parse_size, BindMount, Limits, RunAs, SandboxSpec, Security,
    Template,
};
use airlock_protocol::{
    AgentClient, Event, ExitStatus, Identity, ProcessLimits, Request, SpawnRequest,
};
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// Options of `airlock run`. Defaults are the safe ones of the sandbox spec.
#[derive(Args)]
pub struct RunArgs {
    /// Root filesystem: `host` (read-only host /usr, /bin, /lib*, generated
    /// /etc) or a directory holding a root filesystem (read-only beneath a
    /// private writable layer; its files keep their owners).
    #[arg(long, default_value = "host", value_name = "host|DIR")]
    template: String,
    /// Isolation tier: `process` (namespaces, seccomp, Landlock and
    /// cgroups on this kernel), `oci` (the sandbox's OCI bundle under runc)
    /// or `gvisor` (under gVisor's runsc: a kernel of its own). `airlock
    /// tiers` says which a daemon here can run.
    #[arg(long, default_value = "process", value_name = "process|oci|gvisor")]
    tier: String,
    /// The OCI runtime's binary for `--tier oci|gvisor` (default: runc or
    /// runsc from PATH).
    #[arg(long, value_name = "BINARY")]
    runtime: Option<std::path::PathBuf>,
    /// gVisor's platform for `--tier gvisor`.
    #[arg(long, default_value = "ptrace", value_name = "PLATFORM")]
    gvisor_platform: String,
    /// Memory limit (the writable layer counts against it).
    #[arg(long, default_value = "512M", value_name = "SIZE")]
    memory: String,
    /// CPU quota in CPUs.
    #[arg(
        long,
        default_value = "1",
        value_name = "N",
        allow_hyphen_values = true
    )]
    cpus: String,
    /// Maximum number of processes and threads.
    #[arg(long, default_value_t = airlock_policy::DEFAULT_PIDS, value_name = "N")]
    pids: u32,
    /// Size of the private writable layer (/, /tmp, /home/user); at most
    /// three quarters of --memory, since the layer is memory.
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    disk: String,
    /// Wall-clock limit; the whole sandbox is killed at it.
    #[arg(long, default_value = "300s", value_name = "DURATION")]
    timeout: String,
    /// Environment variable for the command (repeatable). Nothing is
    /// inherited from the host.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// Identity of the command: `user` (uid 1000, no capabilities) or `root`
    /// (root only inside the sandbox's user namespace).
    #[arg(long, value_enum, default_value_t = UserArg::User)]
    user: UserArg,
    /// Bind a host path into the sandbox (repeatable); `:ro` for read-only.
    #[arg(long = "mount", short = 'v', value_name = "HOST:SANDBOX[:ro]")]
    mounts: Vec<String>,
    #[command(flatten)]
    net: NetArgs,
    /// `NAME=IP` the sandbox's egress resolves NAME to instead of asking the
    /// host's resolver (repeatable; for tests and air-gapped hosts).
    #[arg(long = "egress-host", value_name = "NAME=IP")]
    egress_host: Vec<String>,
    /// Open-file limit of every process.
    #[arg(long, default_value_t = airlock_policy::DEFAULT_NOFILE, value_name = "N")]
    nofile: u64,
    /// Cap on output per stream; past it the stream is cut (the writer gets
    /// SIGPIPE) and the result says so.
    #[arg(long, default_value = "16M", value_name = "SIZE")]
    output_limit: String,
    /// Print one JSON result object instead of streaming output.
    #[arg(long)]
    json: bool,
    /// Start even when the kernel cannot enforce Landlock (weaker sandbox).
    #[arg(long)]
    unsafe_allow_no_landlock: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum UserArg {
    User,
    Root,
}

/// The `--json` result.
#[derive(Serialize)]
struct RunResult {
    sandbox_id: String,
    exit_code: i32,
    signal: Option<i32>,
    oom: bool,
    timed_out: bool,
    wall_time_ms: u64,
    cpu_time_ms: u64,
    peak_memory_bytes: Option<u64>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

/// Input that cannot be run, reported as one line with exit code 2.
fn spec_from_args(args: &RunArgs) -> Result<SandboxSpec, String> {
    let err = |e: airlock_policy::ParseError| e.to_string();
    let template = match args.template.as_str() {
        "host" => Template::Host,
        // A directory is one read-only layer, its files owned inside as
        // they are on disk (an idmapped mount: root's files are root's).
        dir => Template::Layers {
            layers: vec![std::path::absolute(dir).map_err(|e| format!("template `{dir}`: {e}"))?],
        },
    };
    let limits = Limits {
        memory_bytes: parse_size(&args.memory).map_err(err)?,
        cpu_millis: parse_cpus(&args.cpus).map_err(err)?,
        pids: args.pids,
        disk_bytes: parse_size(&args.disk).map_err(err)?,
        nofile: args.nofile,
        output_bytes: parse_size(&args.output_limit).map_err(err)?,
        // A one-shot sandbox keeps its writable layer in memory: there is
        // no daemon's disk store to put it in.
        layer: airlock_policy::LayerBacking::Memory,
    };
    let timeout = parse_duration(&args.timeout).map_err(err)?;
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("--env `{pair}` is not K=V"))?;
        env.insert(key.to_owned(), value.to_owned());
    }
    let mut mounts = Vec::new();
    for mount in &args.mounts {
        let mut parsed = BindMount::parse(mount).map_err(|e| e.to_string())?;
        if parsed.source.is_relative() {
            parsed.source =
                std::path::absolute(&parsed.source).map_err(|e| format!("mount `{mount}`: {e}"))?;
        }
        mounts.push(parsed);
    }
    let spec = SandboxSpec {
        template,
        limits,
        mounts,
        network: args.net.policy(),
        env,
        cwd: args.cwd.clone(),
        user: match args.user {
            UserArg::User => RunAs::User,
            UserArg::Root => RunAs::Root,
        },
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        security: Security {
            unsafe_allow_no_landlock: args.unsafe_allow_no_landlock,
        },
        ..SandboxSpec::default()
    };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

/// Serves the sandbox's egress path from a confined worker process (as
/// the daemon does for sandboxes it creates). Refusals are reported on
/// stderr.
fn serve_egress(
    args: &RunArgs,
    spec: &SandboxSpec,
    jail: &Sandbox,
) -> Result<airlock_egress::Attachment, String> {
    // The names are checked here, so a bad entry is this command's error.
    airlock_egress::resolver(&args.egress_host, None).map_err(|e| e.to_string())?;
    let events: airlock_egress::Events =
        std::sync::Arc::new(|event: airlock_egress::EgressEvent| {
            if !event.allowed {
                eprintln!(
                    "airlock: egress refused: {} {}:{} ({})",
                    event.protocol, event.destination, event.port, event.reason
                );
            }
        });
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the airlock binary: {e}"))?;
    let egress = airlock_egress::Egress::confined(
        airlock::egress_worker::spawn(exe),
        airlock_egress::WorkerConfig {
            hosts: args.egress_host.clone(),
            dns: None,
            limits: airlock_egress::EgressLimits::default(),
        },
        events,
    )
    .map_err(|e| error_chain(&e))?;
    let netns = jail.egress_netns();
    egress
        .attach(jail.id(), &netns, spec.network.clone())
        .map_err(|e| error_chain(&e))
}

pub fn main(args: RunArgs) -> ExitCode {
    let started = Instant::now();
    let spec = match spec_from_args(&args) {
        Ok(spec) => spec,
        Err(message) => {
            eprintln!("airlock: error: {message}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    // Launch before any thread exists: the sandbox init is cloned from us.
    // With network, the sandbox gets a namespace prepared here (see
    // `airlock_jail::net`) and this process goes back to the host's to
    // serve its egress path.
    let host_namespace = if spec.network.is_none() {
        None
    } else {
        match airlock_jail::net::HostNamespace::current().and_then(|host| {
            airlock_jail::net::enter_egress_namespace().map(|pending| (host, pending))
        }) {
            Ok(host) => Some(host),
            Err(e) => {
                eprintln!("airlock: error: {}", error_chain(&e));
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    };
    let runtime_dir = RuntimeDir::system();
    let launched = Prepared::of_tier(
        &args.tier,
        args.runtime.clone(),
        &args.gvisor_platform,
        &runtime_dir,
    )
    .and_then(|prepared| {
        prepared.launch(
            &spec,
            &runtime_dir,
            airlock_jail::launch::new_sandbox_id(),
            None,
        )
    });
    if let Some((host, pending)) = host_namespace {
        if let Err(e) = pending.wait().and_then(|()| host.go_back()) {
            eprintln!("airlock: error: {}", error_chain(&e));
            if let Ok(mut jail) = launched {
                let _ = jail.teardown();
            }
            return ExitCode::from(EXIT_INTERNAL);
        }
    }
    let mut jail = match launched {
        Ok(jail) => jail,
        Err((message, bad_input)) => {
            eprintln!("airlock: error: {message}");
            return ExitCode::from(if bad_input {
                EXIT_BAD_INPUT
            } else {
                EXIT_INTERNAL
            });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("airlock: error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    let outcome = runtime.block_on(async {
        let _egress = if spec.network.is_none() {
            None
        } else {
            Some(serve_egress(&args, &spec, &jail)?)
        };
        session(&args, &spec, &mut jail).await
    });
    // The sandbox dies while its figures are read (they outlive its
    // processes), rather than after.
    jail.kill();
    let stats = jail.stats();
    let teardown = jail.teardown();
    // A thread may still be blocked reading our stdin (a terminal the
    // command never read from): do not wait for it.
    runtime.shutdown_background();
    let mut outcome = match outcome {
        Ok(outcome) => outcome,
        Err(message) => {
            eprintln!("airlock: error: {message}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    if let Err(what) = teardown {
        eprintln!("airlock: error: teardown failed: {what}");
        return ExitCode::from(EXIT_INTERNAL);
    }
    // The sandbox lives for this one command, so any OOM kill in it is this
    // command's (the victim may be a child, with the shell exiting 137).
    if stats.oom_kills > 0 {
        outcome.status.oom = true;
    }
    let code = outcome.status.shell_code();
    if args.json {
        let result = RunResult {
            sandbox_id: jail.id().to_owned(),
            exit_code: code,
            signal: outcome.status.signal,
            oom: outcome.status.oom,
            timed_out: outcome.status.timed_out,
            wall_time_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            cpu_time_ms: stats.cpu_time_ns / 1_000_000,
            peak_memory_bytes: stats.peak_memory_bytes,
            stdout: String::from_utf8_lossy(&outcome.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&outcome.stderr).into_owned(),
            stdout_truncated: outcome.status.stdout_truncated,
            stderr_truncated: outcome.status.stderr_truncated,
        };
        match serde_json::to_string(&result) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("airlock: error: cannot encode the result: {e}");
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    } else if outcome.status.timed_out {
        eprintln!(
            "airlock: sandbox {} killed at its {} timeout",
            jail.id(),
            args.timeout
        );
    } else if outcome.status.oom {
        eprintln!(
            "airlock: sandbox {} ran out of memory ({} limit)",
            jail.id(),
            args.memory
        );
    }
    ExitCode::from((code & 0xff) as u8)
}

struct Outcome {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

async fn session(
    args: &RunArgs,
    spec: &SandboxSpec,
    jail: &mut Sandbox,
) -> Result<Outcome, String> {
    let channel = jail.take_channel().ok_or("the agent channel is gone")?;
    channel
        .set_nonblocking(true)
        .map_err(|e| format!("cannot use the agent channel: {e}"))?;
    let stream = tokio::net::UnixStream::from_std(channel)
        .map_err(|e| format!("cannot use the agent channel: {e}"))?;
    // The signals are caught before the command starts, so none is lost.
    let mut signals = Signals::new()?;
    // The agent is the one just launched from this install, so the spawn
    // goes right behind the greeting.
    let (agent, mut events) = AgentClient::connect_with(
        stream,
        1,
        Request::Spawn(SpawnRequest {
            cmd: args.command[0].clone(),
            args: args.command[1..].to_vec(),
            env: spec.process_env(spec.user),
            cwd: spec.cwd.clone(),
            user: match spec.user {
                RunAs::User => Identity::User,
                RunAs::Root => Identity::Root,
            },
            stdin: true,
            pty: None,
            timeout_ms: None,
            output_limit: spec.limits.output_bytes,
            limits: ProcessLimits {
                nofile: spec.limits.nofile,
                // One page over the writable layer: on the sandbox's own
                // disk the layer's ENOSPC comes first; the limit still caps
                // any one file written to a read-write host mount.
                fsize_bytes: spec.limits.writable_layer_bytes() + 4096,
            },
        }),
    )
    .await
    .map_err(|e| format!("cannot start the command: {e}"))?;

    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms));
    tokio::pin!(deadline);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut pid = None;
    let mut timed_out = false;
    let status = loop {
        tokio::select! {
            event = events.next() => {
                let frame = match event {
                    Ok(Some(frame)) => frame,
                    // The agent died: the sandbox was killed (timeout, OOM of
                    // the agent, or from outside).
                    Ok(None) | Err(_) => break killed_status(pid.unwrap_or(0), timed_out),
                };
                match frame.msg {
                    Event::Started { pid: started } => {
                        pid = Some(started);
                        if stdin_is_dev_null() {
                            let _ = agent.request(Request::CloseStdin { pid: started }).await;
                        } else {
                            tokio::spawn(forward_stdin(agent.clone(), started));
                        }
                    }
                    Event::Stdout => emit(args.json, &mut stdout, &frame.payload, &mut std::io::stdout()),
                    Event::Stderr => emit(args.json, &mut stderr, &frame.payload, &mut std::io::stderr()),
                    Event::Exited(status) => break status,
                    Event::Error { kind, message } => {
                        let code = match kind {
                            airlock_protocol::ErrorKind::NotFound => 127,
                            airlock_protocol::ErrorKind::NotExecutable | airlock_protocol::ErrorKind::PermissionDenied => 126,
                            _ => 125,
                        };
                        eprintln!("airlock: cannot run `{}`: {message}", args.command[0]);
                        break ExitStatus { pid: 0, code: Some(code), signal: None, oom: false, timed_out: false, stdout_truncated: false, stderr_truncated: false };
                    }
                    _ => {}
                }
            }
            () = &mut deadline, if !timed_out => {
                timed_out = true;
                jail.kill();
            }
            Some(signal) = signals.next() => {
                if let Some(pid) = pid {
                    let _ = agent.request(Request::Signal { pid, signal }).await;
                } else {
                    jail.kill();
                }
            }
        }
    };
    let _ = std::io::stdout().flush();
    Ok(Outcome {
        status,
        stdout,
        stderr,
    })
}

fn killed_status(pid: u32, timed_out: bool) -> ExitStatus {
    ExitStatus {
        pid,
        code: None,
        signal: Some(libc::SIGKILL),
        oom: false,
        timed_out,
        stdout_truncated: false,
        stderr_truncated: false,
    }
}

fn emit(collect: bool, buffer: &mut Vec<u8>, bytes: &[u8], out: &mut dyn Write) {
    if collect {
        buffer.extend_from_slice(bytes);
    } else {
        // A closed stdout of ours must not stop the sandbox's teardown.
        let _ = out.write_all(bytes).and_then(|()| out.flush());
    }
}

/// True when our stdin is /dev/null: nothing to forward, and no thread to
/// start for reading it.
fn stdin_is_dev_null() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(null) = std::fs::metadata("/dev/null") else {
        return false;
    };
    let Ok(stdin) = rustix::fs::fstat(rustix::stdio::stdin()) else {
        return false;
    };
    (stdin.st_mode & libc::S_IFMT) == libc::S_IFCHR && stdin.st_rdev == null.rdev()
}

/// Copies our stdin to the process; closes its stdin at our EOF. Each chunk
/// waits for the agent's `done`, so a fast producer is slowed to the pace the
/// command reads at instead of overflowing the agent's queue.
async fn forward_stdin(agent: AgentClient, pid: u32) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let written = match agent
                    .request_with_payload(Request::WriteStdin { pid }, buffer[..n].to_vec())
                    .await
                {
                    Ok(events) => events.finish().await,
                    Err(e) => Err(e),
                };
                if !matches!(written, Ok(Event::Done)) {
                    return; // the command closed its stdin or ended
                }
            }
        }
    }
    if let Ok(events) = agent.request(Request::CloseStdin { pid }).await {
        let _ = events.finish().await;
    }
}

/// SIGINT, SIGTERM and SIGHUP of the CLI, forwarded to the command.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let make = |kind| signal(kind).map_err(|e| format!("cannot handle signals: {e}"));
        Ok(Signals {
            interrupt: make(SignalKind::interrupt())?,
            terminate: make(SignalKind::terminate())?,
            hangup: make(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> Option<i32> {
        tokio::select! {
            s = self.interrupt.recv() => s.map(|()| libc::SIGINT),
            s = self.terminate.recv() => s.map(|()| libc::SIGTERM),
            s = self.hangup.recv() => s.map(|()| libc::SIGHUP),
        }
    }
}
