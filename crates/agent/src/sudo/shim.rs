//! The `sudo` a sandbox's processes run: the agent binary called as
//! `sudo` (bound over the image's `/usr/bin/sudo`). It reads sudo's command
//! line as sudo does, resolves the command's environment as sudo's
//! defaults would (`env_reset`, Debian's `secure_path`), and asks the agent
//! to run it ([`super`] says why that is sound); then it relays signals
//! and exits as the command did.
//!
//! Every rule is `NOPASSWD: ALL`, so the options about passwords and
//! timestamps (`-n`, `-S`, `-A`, `-k`, `-K`, `-v`, `-p`) are accepted and
//! change nothing. Targets are `root` and `user`, the two identities every
//! tier has; `-b` (background), `-e` (sudoedit), `-r`/`-t` (SELinux) and
//! `-C` above the caller's descriptors are refused with a sentence.

use super::wire::{self, Ask, Reply, Tell};
use airlock_protocol::Identity;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::ExitCode;

/// What `PATH` a command gets (Debian's `secure_path`).
pub const SECURE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Variables `env_reset` keeps from the caller (sudo's defaults plus
/// Debian's `env_keep`).
const KEPT: &[&str] = &[
    "TERM",
    "COLORTERM",
    "COLORS",
    "DISPLAY",
    "XAUTHORITY",
    "HOSTNAME",
    "LANG",
    "LANGUAGE",
    "LINGUAS",
    "LS_COLORS",
    "TZ",
];

/// Exit code of sudo's own failures.
const EXIT_FAILED: u8 = 1;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// `-u`: the target, as given.
    pub user: Option<String>,
    /// `-E` (everything) or `--preserve-env=LIST`.
    pub preserve: Preserve,
    /// `-i`.
    pub login: bool,
    /// `-s`.
    pub shell: bool,
    /// `-D DIR`.
    pub chdir: Option<String>,
    /// `NAME=value` words before the command.
    pub assignments: Vec<(String, String)>,
    pub command: Vec<String>,
}

/// Which of the caller's variables survive.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Preserve {
    /// Only [`KEPT`].
    #[default]
    Reset,
    /// All of them.
    All,
    /// [`KEPT`] and these.
    Some(Vec<String>),
}

/// What the shim does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Run(Options),
    /// Print and exit with this code (`-h`, `-V`, `-l`, `-v`, `-k`...).
    Say(String, u8),
    /// Print to stderr and exit 1.
    Refuse(String),
}

const USAGE: &str =
    "usage: sudo [-EHiknSs] [-D directory] [-u user] [VAR=value] [-i | -s] [command [arg ...]]\n";

/// Parses sudo's command line (without `argv[0]`).
pub fn parse(args: &[String]) -> Action {
    let mut options = Options::default();
    let mut list = false;
    let mut only_checks = false;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            i += 1;
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (long, None),
            };
            let take = |i: &mut usize| -> Option<String> {
                value.clone().or_else(|| {
                    *i += 1;
                    args.get(*i).cloned()
                })
            };
            match name {
                "user" => match take(&mut i) {
                    Some(user) => options.user = Some(user),
                    None => {
                        return Action::Refuse(format!(
                            "sudo: option '--user' requires an argument\n{USAGE}"
                        ))
                    }
                },
                "chdir" => match take(&mut i) {
                    Some(dir) => options.chdir = Some(dir),
                    None => {
                        return Action::Refuse(format!(
                            "sudo: option '--chdir' requires an argument\n{USAGE}"
                        ))
                    }
                },
                "preserve-env" => {
                    options.preserve = match (&value, options.preserve.clone()) {
                        (None, _) => Preserve::All,
                        (Some(_), Preserve::All) => Preserve::All,
                        (Some(list), Preserve::Some(mut names)) => {
                            names.extend(list.split(',').map(str::to_owned));
                            Preserve::Some(names)
                        }
                        (Some(list), Preserve::Reset) => {
                            Preserve::Some(list.split(',').map(str::to_owned).collect())
                        }
                    }
                }
                "login" => options.login = true,
                "shell" => options.shell = true,
                "list" => list = true,
                "help" => return Action::Say(USAGE.to_owned(), 0),
                "version" => return Action::Say(version(), 0),
                "validate" | "remove-timestamp" | "reset-timestamp" => only_checks = true,
                "non-interactive" | "stdin" | "askpass" | "set-home" | "preserve-groups"
                | "bell" => {}
                "prompt" | "close-from" | "command-timeout" | "other-user" | "group" | "host" => {
                    if take(&mut i).is_none() {
                        return Action::Refuse(format!(
                            "sudo: option '--{name}' requires an argument\n{USAGE}"
                        ));
                    }
                }
                "background" | "edit" | "role" | "type" => {
                    return Action::Refuse(unsupported(&format!("--{name}")));
                }
                _ => {
                    return Action::Refuse(format!("sudo: unrecognized option '--{name}'\n{USAGE}"))
                }
            }
            i += 1;
            continue;
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            break;
        };
        let chars: Vec<char> = flags.chars().collect();
        let mut j = 0;
        while j < chars.len() {
            let flag = chars[j];
            // Options with an argument take the rest of this word, or the
            // next word.
            let mut argument = |i: &mut usize| -> Option<String> {
                let rest: String = chars[j + 1..].iter().collect();
                j = chars.len();
                if rest.is_empty() {
                    *i += 1;
                    args.get(*i).cloned()
                } else {
                    Some(rest)
                }
            };
            match flag {
                'u' => match argument(&mut i) {
                    Some(user) => options.user = Some(user),
                    None => {
                        return Action::Refuse(format!(
                            "sudo: option requires an argument -- 'u'\n{USAGE}"
                        ))
                    }
                },
                'D' => match argument(&mut i) {
                    Some(dir) => options.chdir = Some(dir),
                    None => {
                        return Action::Refuse(format!(
                            "sudo: option requires an argument -- 'D'\n{USAGE}"
                        ))
                    }
                },
                'g' | 'p' | 'C' | 'T' | 'U' => {
                    if argument(&mut i).is_none() {
                        return Action::Refuse(format!(
                            "sudo: option requires an argument -- '{flag}'\n{USAGE}"
                        ));
                    }
                }
                'h' if args.len() == 1 && chars.len() == 1 => {
                    return Action::Say(USAGE.to_owned(), 0)
                }
                'h' => {
                    if argument(&mut i).is_none() {
                        return Action::Refuse(format!(
                            "sudo: option requires an argument -- 'h'\n{USAGE}"
                        ));
                    }
                }
                'E' => options.preserve = Preserve::All,
                'i' => options.login = true,
                's' => options.shell = true,
                'l' => list = true,
                'V' => return Action::Say(version(), 0),
                'v' | 'K' | 'k' => only_checks = true,
                'n' | 'S' | 'A' | 'H' | 'P' | 'B' => {}
                'b' | 'e' | 'r' | 't' => return Action::Refuse(unsupported(&format!("-{flag}"))),
                _ => return Action::Refuse(format!("sudo: invalid option -- '{flag}'\n{USAGE}")),
            }
            j += 1;
        }
        i += 1;
    }
    // Assignments, then the command.
    while let Some((name, value)) = args.get(i).and_then(|a| a.split_once('=')) {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            break;
        }
        options
            .assignments
            .push((name.to_owned(), value.to_owned()));
        i += 1;
    }
    options.command = args[i.min(args.len())..].to_vec();
    if options.login && options.shell {
        return Action::Refuse(format!(
            "sudo: you may not specify both the -i and -s options\n{USAGE}"
        ));
    }
    if list {
        return Action::Say(
            "User may run the following commands on this sandbox:\n    (ALL : ALL) NOPASSWD: ALL\n"
                .to_owned(),
            0,
        );
    }
    if only_checks && options.command.is_empty() {
        return Action::Say(String::new(), 0);
    }
    if options.command.is_empty() && !options.login && !options.shell {
        return Action::Refuse(USAGE.to_owned());
    }
    Action::Run(options)
}

fn version() -> String {
    "Sudo version 1.9 (airlock: granted by the sandbox's agent; every rule is NOPASSWD: ALL)\n"
        .to_owned()
}

fn unsupported(option: &str) -> String {
    format!("sudo: {option} is not supported in an airlock sandbox\n")
}

/// An account as `/etc/passwd` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

/// The accounts of `passwd` (the file's text).
pub fn accounts(passwd: &str) -> Vec<Account> {
    passwd
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 7 {
                return None;
            }
            Some(Account {
                name: fields[0].to_owned(),
                uid: fields[2].parse().ok()?,
                gid: fields[3].parse().ok()?,
                home: fields[5].to_owned(),
                shell: fields[6].to_owned(),
            })
        })
        .collect()
}

/// Who runs the shim, and from where.
#[derive(Debug, Clone)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub nofile: u64,
    pub fsize_bytes: u64,
}

/// What the agent is asked to run for `options`, or what sudo prints.
pub(crate) fn resolve(
    options: &Options,
    caller: &Caller,
    passwd: &[Account],
) -> Result<Ask, String> {
    let account_of = |uid: u32| passwd.iter().find(|a| a.uid == uid);
    let (user, uid) = match options.user.as_deref() {
        None => (Identity::Root, 0),
        Some(name) => {
            let uid = match name.strip_prefix('#') {
                Some(number) => number.parse::<u32>().ok(),
                None => passwd
                    .iter()
                    .find(|a| a.name == name)
                    .map(|a| a.uid)
                    .or_else(|| name.parse::<u32>().ok().filter(|_| name == "0")),
            };
            match uid {
                Some(0) => (Identity::Root, 0),
                Some(uid) if uid == crate::privileges::USER_ID => (Identity::User, uid),
                Some(_) => {
                    return Err(format!(
                        "sudo: an airlock sandbox runs commands as root or user, not as {name}\n"
                    ))
                }
                None => return Err(format!("sudo: unknown user {name}\n")),
            }
        }
    };
    let (name, home, shell) = match account_of(uid) {
        Some(a) => (a.name.clone(), a.home.clone(), a.shell.clone()),
        None if uid == 0 => ("root".into(), "/root".into(), "/bin/sh".into()),
        None => ("user".into(), "/home/user".into(), "/bin/sh".into()),
    };
    let shell = if shell.is_empty() {
        "/bin/sh".to_owned()
    } else {
        shell
    };
    let caller_name = account_of(caller.uid)
        .map(|a| a.name.clone())
        .unwrap_or_else(|| caller.uid.to_string());

    let mut env: BTreeMap<String, String> = match &options.preserve {
        Preserve::All => caller.env.clone(),
        other => caller
            .env
            .iter()
            .filter(|(k, _)| {
                KEPT.contains(&k.as_str())
                    || k.starts_with("LC_")
                    || matches!(other, Preserve::Some(names) if names.iter().any(|n| n == *k))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    for (key, value) in [
        ("PATH", SECURE_PATH.to_owned()),
        ("HOME", home.clone()),
        ("USER", name.clone()),
        ("LOGNAME", name.clone()),
        ("SHELL", shell.clone()),
        ("MAIL", format!("/var/mail/{name}")),
        ("SUDO_USER", caller_name),
        ("SUDO_UID", caller.uid.to_string()),
        ("SUDO_GID", caller.gid.to_string()),
    ] {
        env.insert(key.to_owned(), value);
    }
    env.insert("SUDO_COMMAND".into(), options.command.join(" "));
    for (key, value) in &options.assignments {
        env.insert(key.clone(), value.clone());
    }

    let escaped = || {
        options
            .command
            .iter()
            .map(|word| escape(word))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (program, args) = if options.login {
        let mut args = vec!["-l".to_owned()];
        if !options.command.is_empty() {
            args.extend(["-c".to_owned(), escaped()]);
        }
        (shell.clone(), args)
    } else if options.shell {
        let shell = caller
            .env
            .get("SHELL")
            .filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or(shell.clone());
        let args = if options.command.is_empty() {
            Vec::new()
        } else {
            vec!["-c".to_owned(), escaped()]
        };
        (shell, args)
    } else {
        let mut words = options.command.iter();
        let Some(program) = words.next() else {
            return Err(USAGE.to_owned());
        };
        (program.clone(), words.cloned().collect())
    };
    let cwd = match (&options.chdir, options.login) {
        (Some(dir), _) => dir.clone(),
        (None, true) => home,
        (None, false) => caller.cwd.clone(),
    };
    Ok(Ask {
        program,
        args,
        env: env.into_iter().collect(),
        cwd,
        user,
        nofile: caller.nofile,
        fsize_bytes: caller.fsize_bytes,
    })
}

/// sudo's quoting for `-s`/`-i` with a command: every character but
/// letters, digits, `_`, `-` and `$` behind a backslash.
fn escape(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if !(c.is_alphanumeric() || c == '_' || c == '-' || c == '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The shim's entry point: `args` without `argv[0]`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let args: Vec<String> = match args.into_iter().map(OsString::into_string).collect() {
        Ok(args) => args,
        Err(_) => return fail("sudo: arguments must be UTF-8 in an airlock sandbox\n"),
    };
    let options = match parse(&args) {
        Action::Run(options) => options,
        Action::Say(text, code) => {
            let _ = std::io::stdout().write_all(text.as_bytes());
            return ExitCode::from(code);
        }
        Action::Refuse(text) => return fail(&text),
    };
    let passwd = accounts(&std::fs::read_to_string("/etc/passwd").unwrap_or_default());
    let caller = caller();
    let ask = match resolve(&options, &caller, &passwd) {
        Ok(ask) => ask,
        Err(text) => return fail(&text),
    };
    let stdio = Stdio::take();
    match run(wire::SOCKET_NAME, &ask, stdio.borrowed()) {
        Ok(Ended::Code(code)) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(EXIT_FAILED)),
        Ok(Ended::Signal(signal)) => die_by(signal),
        Ok(Ended::Unknown) => ExitCode::from(EXIT_FAILED),
        Err(text) => fail(&text),
    }
}

fn fail(text: &str) -> ExitCode {
    let _ = std::io::stderr().write_all(text.as_bytes());
    ExitCode::from(EXIT_FAILED)
}

fn caller() -> Caller {
    let limit = |resource| {
        rustix::process::getrlimit(resource)
            .current
            .unwrap_or(u64::MAX)
    };
    Caller {
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
        env: std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect(),
        cwd: std::env::current_dir()
            .ok()
            .and_then(|d| d.into_os_string().into_string().ok())
            .unwrap_or_default(),
        nofile: limit(rustix::process::Resource::Nofile),
        fsize_bytes: limit(rustix::process::Resource::Fsize),
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
    Unknown,
}

/// Asks the agent listening on `socket` to run `ask` on `stdio`, relays
/// signals until it ends, and says how it ended. The error is what sudo
/// prints.
pub(crate) fn run(socket: &str, ask: &Ask, stdio: [BorrowedFd<'_>; 3]) -> Result<Ended, String> {
    let unreachable = |_| {
        "sudo: the sandbox's agent grants no sudo here (its image has no /usr/bin/sudo)\n"
            .to_owned()
    };
    let conn = wire::connect(socket).map_err(unreachable)?;
    // The signals to relay are blocked and read from a signalfd, so none
    // is lost between the ask and the wait.
    let signals = SignalFd::relaying().map_err(|e| format!("sudo: cannot take signals: {e}\n"))?;
    wire::send_ask(conn.as_fd(), ask, stdio)
        .map_err(|e| format!("sudo: cannot reach the sandbox's agent: {e}\n"))?;
    match wire::reply(conn.as_fd()) {
        Ok(Reply::Started) => {}
        Ok(Reply::Refused { message }) => return Err(with_newline(message)),
        Ok(Reply::Exited { .. }) | Err(_) => {
            return Err("sudo: the sandbox's agent did not start the command\n".to_owned())
        }
    }
    loop {
        let mut fds = [
            rustix::event::PollFd::new(&conn, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&signals.fd, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("sudo: {e}\n")),
        }
        let (conn_ready, signal_ready) =
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if signal_ready {
            while let Some(signal) = signals.next() {
                let _ = wire::tell(conn.as_fd(), &Tell::Signal { signal });
            }
        }
        if conn_ready {
            return match wire::reply(conn.as_fd()) {
                Ok(Reply::Exited {
                    code: Some(code), ..
                }) => Ok(Ended::Code(code)),
                Ok(Reply::Exited {
                    signal: Some(signal),
                    ..
                }) => Ok(Ended::Signal(signal)),
                Ok(_) => Ok(Ended::Unknown),
                Err(_) => Err("sudo: the sandbox's agent went away\n".to_owned()),
            };
        }
    }
}

fn with_newline(mut text: String) -> String {
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// Ends this process by `signal`, as the command ended, so the caller's
/// shell sees the same; exit 128 + signal if it does not kill.
fn die_by(signal: i32) -> ExitCode {
    // SAFETY: signal/sigprocmask/raise take integers and local sets; the
    // default disposition installs no handler.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, set.as_ptr(), std::ptr::null_mut());
        libc::raise(signal);
    }
    ExitCode::from(u8::try_from(128 + (signal & 0x7f)).unwrap_or(EXIT_FAILED))
}

/// This process's stdin, stdout and stderr, with `/dev/null` for any that
/// is closed.
struct Stdio {
    /// `/dev/null` opened for closed slots, held open as long as this is.
    _opened: Vec<OwnedFd>,
    fds: [i32; 3],
}

impl Stdio {
    fn take() -> Stdio {
        let mut opened = Vec::new();
        let mut fds = [0, 1, 2];
        for (slot, fd) in fds.iter_mut().enumerate() {
            // SAFETY: F_GETFD on a descriptor number reads nothing of ours.
            let open = unsafe { libc::fcntl(slot as i32, libc::F_GETFD) } >= 0;
            if !open {
                if let Ok(null) = std::fs::OpenOptions::new()
                    .read(slot == 0)
                    .write(slot != 0)
                    .open("/dev/null")
                {
                    let null = OwnedFd::from(null);
                    *fd = null.as_raw_fd();
                    opened.push(null);
                }
            }
        }
        Stdio {
            _opened: opened,
            fds,
        }
    }

    fn borrowed(&self) -> [BorrowedFd<'_>; 3] {
        // SAFETY: each number is 0, 1 or 2 (open, checked in `take`) or a
        // descriptor in `self._opened`, all open as long as `self` is.
        self.fds.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
    }
}

/// The relayed signals, blocked and read from a signalfd.
struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    fn relaying() -> std::io::Result<SignalFd> {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset/sigaddset initialise and fill a local set;
        // sigprocmask and signalfd read it. The returned descriptor is
        // ours alone.
        let fd = unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            for signal in wire::RELAYED {
                libc::sigaddset(set.as_mut_ptr(), signal);
            }
            libc::sigprocmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
            libc::signalfd(-1, set.as_ptr(), libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: signalfd returned a new descriptor nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(SignalFd { fd })
    }

    /// The next pending signal, if any.
    fn next(&self) -> Option<i32> {
        let mut info = std::mem::MaybeUninit::<libc::signalfd_siginfo>::uninit();
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: read writes at most `size` bytes into `info`, which has
        // exactly that size; it is read only when all of it was written.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), info.as_mut_ptr().cast(), size) };
        if n != size as isize {
            return None;
        }
        // SAFETY: fully written by the read above.
        let info = unsafe { info.assume_init() };
        i32::try_from(info.ssi_signo).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn run_options(line: &str) -> Options {
        match parse(&words(line)) {
            Action::Run(options) => options,
            other => panic!("{line}: {other:?}"),
        }
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";

    fn caller() -> Caller {
        Caller {
            uid: 1000,
            gid: 1000,
            env: [
                ("PATH", "/home/user/.local/bin:/usr/bin"),
                ("TERM", "xterm"),
                ("LC_ALL", "C.UTF-8"),
                ("SECRET", "s"),
                ("SHELL", "/bin/zsh"),
                ("HOME", "/home/user"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            cwd: "/home/user/project".into(),
            nofile: 4096,
            fsize_bytes: u64::MAX,
        }
    }

    fn ask(line: &str) -> Ask {
        resolve(&run_options(line), &caller(), &accounts(PASSWD)).unwrap()
    }

    fn env(ask: &Ask, key: &str) -> Option<String> {
        ask.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn a_plain_command_runs_as_root_with_a_reset_environment() {
        let ask = ask("apt-get install -y jq");
        assert_eq!(ask.program, "apt-get");
        assert_eq!(ask.args, words("install -y jq"));
        assert_eq!(ask.user, Identity::Root);
        assert_eq!(ask.cwd, "/home/user/project");
        assert_eq!(env(&ask, "PATH").as_deref(), Some(SECURE_PATH));
        assert_eq!(env(&ask, "HOME").as_deref(), Some("/root"));
        assert_eq!(env(&ask, "USER").as_deref(), Some("root"));
        assert_eq!(env(&ask, "SUDO_USER").as_deref(), Some("user"));
        assert_eq!(env(&ask, "SUDO_UID").as_deref(), Some("1000"));
        assert_eq!(env(&ask, "TERM").as_deref(), Some("xterm"));
        assert_eq!(env(&ask, "LC_ALL").as_deref(), Some("C.UTF-8"));
        assert_eq!(env(&ask, "SECRET"), None);
        assert_eq!(ask.nofile, 4096);
    }

    #[test]
    fn preserve_env_keeps_everything_or_a_list() {
        assert_eq!(env(&ask("-E env"), "SECRET").as_deref(), Some("s"));
        assert_eq!(
            env(&ask("--preserve-env env"), "SECRET").as_deref(),
            Some("s")
        );
        assert_eq!(
            env(&ask("--preserve-env=SECRET env"), "SECRET").as_deref(),
            Some("s")
        );
        assert_eq!(env(&ask("--preserve-env=OTHER env"), "SECRET"), None);
        // secure_path applies even with -E.
        assert_eq!(env(&ask("-E env"), "PATH").as_deref(), Some(SECURE_PATH));
    }

    #[test]
    fn assignments_before_the_command_set_variables() {
        let ask = ask("-n FOO=bar A_1=x=y printenv FOO");
        assert_eq!(env(&ask, "FOO").as_deref(), Some("bar"));
        assert_eq!(env(&ask, "A_1").as_deref(), Some("x=y"));
        assert_eq!(ask.program, "printenv");
        assert_eq!(ask.args, vec!["FOO"]);
    }

    #[test]
    fn targets_are_root_and_user_only() {
        assert_eq!(ask("-u root id").user, Identity::Root);
        assert_eq!(ask("-uroot id").user, Identity::Root);
        assert_eq!(ask("--user=user id").user, Identity::User);
        assert_eq!(ask("-u #1000 id").user, Identity::User);
        assert_eq!(ask("-u #0 id").user, Identity::Root);
        let user = ask("-u user -H id");
        assert_eq!(env(&user, "HOME").as_deref(), Some("/home/user"));
        for line in ["-u nobody id", "-u ghost id"] {
            let refused = resolve(&run_options(line), &caller(), &accounts(PASSWD)).unwrap_err();
            assert!(refused.starts_with("sudo: "), "{refused}");
        }
    }

    #[test]
    fn login_and_shell_forms_run_a_shell() {
        let login = ask("-i");
        assert_eq!(
            (login.program.as_str(), login.args.clone()),
            ("/bin/bash", words("-l"))
        );
        assert_eq!(login.cwd, "/root");
        let login = ask("-i echo a b;c");
        assert_eq!(login.args, vec!["-l", "-c", "echo a b\\;c"]);
        let shell = ask("-s");
        assert_eq!(shell.program, "/bin/zsh");
        assert_eq!(shell.cwd, "/home/user/project");
        let shell = ask("-s -- ls -la");
        assert_eq!(shell.args, vec!["-c", "ls -la"]);
        let shell = ask("sh -c echo");
        assert_eq!(shell.program, "sh");
    }

    #[test]
    fn chdir_sets_the_working_directory() {
        assert_eq!(ask("-D /tmp pwd").cwd, "/tmp");
        assert_eq!(ask("--chdir=/srv pwd").cwd, "/srv");
        assert_eq!(ask("-D/opt pwd").cwd, "/opt");
    }

    #[test]
    fn checks_lists_and_help_answer_without_running() {
        assert!(matches!(parse(&words("-v")), Action::Say(_, 0)));
        assert!(matches!(parse(&words("-k")), Action::Say(_, 0)));
        assert!(matches!(parse(&words("-K")), Action::Say(_, 0)));
        assert!(
            matches!(parse(&words("-l")), Action::Say(text, 0) if text.contains("NOPASSWD: ALL"))
        );
        assert!(matches!(parse(&words("-h")), Action::Say(text, 0) if text.starts_with("usage:")));
        assert!(
            matches!(parse(&words("-V")), Action::Say(text, 0) if text.starts_with("Sudo version"))
        );
        assert!(matches!(parse(&[]), Action::Refuse(text) if text.starts_with("usage:")));
        assert!(matches!(run_options("-k true").command.as_slice(), [c] if c == "true"));
    }

    #[test]
    fn unknown_and_unsupported_options_are_refused_with_a_sentence() {
        for line in [
            "-b sleep 1",
            "-e /etc/hosts",
            "-Z true",
            "--frobnicate true",
            "-i -s",
            "-u",
        ] {
            match parse(&words(line)) {
                Action::Refuse(text) => assert!(text.starts_with("sudo: "), "{line}: {text}"),
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    #[test]
    fn options_end_at_the_command() {
        let options = run_options("ls -u root");
        assert_eq!(options.user, None);
        assert_eq!(options.command, words("ls -u root"));
        let options = run_options("-nE -u user -- -weird");
        assert_eq!(options.preserve, Preserve::All);
        assert_eq!(options.command, vec!["-weird"]);
    }
}
