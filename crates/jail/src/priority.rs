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
    fn an_unknown_thread_is_an_error() {
        assert!(set_background(i32::MAX, true).is_err());
    }
}
