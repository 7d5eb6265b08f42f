//! Child processes that must not outlive their parent (`da3 repro`'s children, `da3
//! rpc-server`'s workers). Every such child is `da3` itself, so the child makes the request
//! of the kernel on its own first step ([`die_with_parent`]), through a safe system-call
//! wrapper, instead of a hook run between fork and exec.

use std::process::Command;

/// The variable through which a child learns which process it must not outlive.
const PARENT_PID: &str = "DA3_PARENT_PID";

/// Marks the `da3` child `command` spawns so that it receives SIGKILL when the thread that
/// spawned it exits (Linux `PR_SET_PDEATHSIG`, requested by the child in
/// [`die_with_parent`]), so a parent killed by any signal, SIGKILL included, leaves no child
/// behind. Spawn from a thread that lives as long as the child should (the main thread, or the
/// thread that waits for the child): the kernel signals when that thread ends. A child whose
/// parent is already gone when it starts exits at once. Returns false where the platform has
/// no such mechanism (the child is then left as is).
pub fn kill_with_parent(command: &mut Command) -> bool {
    command.env(PARENT_PID, std::process::id().to_string());
    cfg!(target_os = "linux")
}

/// The first step of every `da3` process, before any thread exists: a child started with
/// [`kill_with_parent`] asks the kernel for SIGKILL when its parent's spawning thread exits,
/// and exits if that parent is already gone (the signal would then never come). The variable
/// is removed, so that processes this one starts otherwise do not inherit the request.
pub fn die_with_parent() {
    let Some(parent) = std::env::var_os(PARENT_PID) else {
        return;
    };
    // Sound here: no other thread exists yet to read the environment.
    std::env::remove_var(PARENT_PID);
    #[cfg(target_os = "linux")]
    {
        use nix::sys::{prctl, signal::Signal};
        let parent: Option<i32> = parent.to_str().and_then(|p| p.parse().ok());
        let asked = prctl::set_pdeathsig(Signal::SIGKILL);
        if asked.is_err() || parent != Some(nix::unistd::getppid().as_raw()) {
            eprintln!("error: the parent process of this da3 child is gone ({PARENT_PID})");
            std::process::exit(1);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = parent;
}
