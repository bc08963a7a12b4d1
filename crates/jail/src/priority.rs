//! The CPU priority of work done ahead of need. A spare supervisor prepares
//! while creates run on the same cores; it runs under `SCHED_IDLE`, so it
//! takes only the time no one else wants, and is put back under the normal
//! policy once it is claimed, before it launches anything (the sandbox's
//! processes inherit the policy of the one that starts them).

use std::io;

/// Puts thread `tid` (0: the calling thread) under `SCHED_IDLE` when
/// `background`, else under the normal `SCHED_OTHER`. It touches the
/// policy only, never the nice value. Async-signal-safe (one system call):
/// it may run between fork and exec.
pub fn set_background(tid: i32, background: bool) -> io::Result<()> {
    let policy = if background {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialized sched_param that outlives the
    // call, which only reads it; both policies take priority 0, and a bad
    // `tid` is an error return (ESRCH), not undefined behaviour.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts process `pid` back under the normal policy, every thread of it and
/// of its descendants (a spare's setup programs, still running when it is
/// claimed, must not finish at the background's pace while the create
/// waits for them). Threads are done before their children are looked
/// for, so a child started meanwhile inherits the normal policy. Threads
/// and processes that end meanwhile are skipped; the first other failure
/// is returned.
pub fn set_tree_foreground(pid: u32) -> io::Result<()> {
    let mut pending = vec![pid];
    let mut first_error = None;
    while let Some(pid) = pending.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(tid) = task.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            match set_background(tid, false) {
                Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                    first_error.get_or_insert(e);
                }
                _ => {}
            }
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                pending.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Whether thread `tid` (0: the calling thread) runs under `SCHED_IDLE`.
pub fn is_background(tid: i32) -> io::Result<bool> {
    // SAFETY: sched_getscheduler takes no pointers; a bad `tid` is an
    // error return.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(policy == libc::SCHED_IDLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_goes_to_the_background_and_back() {
        // A thread of its own: the test harness's others keep their policy.
        std::thread::spawn(|| {
            assert!(!is_background(0).unwrap());
            set_background(0, true).unwrap();
            assert!(is_background(0).unwrap());
            // Leaving SCHED_IDLE needs CAP_SYS_NICE (or an RLIMIT_NICE that
            // allows it); the daemon and its supervisors run as root.
            if rustix::process::geteuid().is_root() {
                set_background(0, false).unwrap();
                assert!(!is_background(0).unwrap());
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_process_tree_comes_back_to_the_foreground_whole() {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("sh");
        command.args(["-c", "sleep 30 & sleep 30 & wait"]);
        // SAFETY: one system call between fork and exec.
        unsafe {
            command.pre_exec(|| set_background(0, true));
        }
        let mut shell = command.spawn().unwrap();
        let children = || {
            std::fs::read_to_string(format!("/proc/{}/task/{}/children", shell.id(), shell.id()))
                .unwrap_or_default()
                .split_whitespace()
                .map(|c| c.parse::<i32>().unwrap())
                .collect::<Vec<_>>()
        };
        let started = std::time::Instant::now();
        while children().len() < 2 {
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let all: Vec<i32> = std::iter::once(shell.id() as i32)
            .chain(children())
            .collect();
        assert!(all.iter().all(|p| is_background(*p).unwrap()), "{all:?}");
        set_tree_foreground(shell.id()).unwrap();
        assert!(all.iter().all(|p| !is_background(*p).unwrap()), "{all:?}");
        for child in children() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(child).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
        shell.kill().unwrap();
        shell.wait().unwrap();
    }

    #[test]
    fn an_unknown_thread_is_an_error() {
        assert!(set_background(i32::MAX, true).is_err());
    }
}
