//! Child processes that must not outlive their parent (`da3 repro`'s children, `da3
//! rpc-server`'s workers).

use std::process::Command;

/// Makes the child `command` spawns receive SIGKILL when the thread that spawned it exits
/// (Linux `PR_SET_PDEATHSIG`), so a parent killed by any signal, SIGKILL included, leaves no
/// child behind. Spawn from a thread that lives as long as the child should (the main thread,
/// or the thread that waits for the child): the kernel signals when that thread ends. If the
/// parent is already gone when the child starts, the spawn fails. Returns false where the
/// platform has no such mechanism (the child is then left as is).
// The command's only `unsafe` code: the `pre_exec` hook below (see its SAFETY comment).
#[allow(unsafe_code)]
pub fn kill_with_parent(command: &mut Command) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the hook runs in the forked child before exec and only makes two system
        // calls, prctl and getppid, both async-signal-safe; it allocates nothing and takes no
        // lock.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died between fork and prctl: the signal will never come.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        true
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = command;
        false
    }
}
