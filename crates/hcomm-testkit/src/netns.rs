//! Network namespaces as hosts: the `ip` command, whether this process may make namespaces,
//! names unique to a test run, and the sweep of namespaces left by test processes that died.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `ip args`; the error output when it fails.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether this process can make network namespaces (root, and `ip` installed); when not,
/// prints that `test` is skipped, and why.
pub fn can_make_namespaces(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("{test}: skipped: network namespaces need root");
        return false;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        println!("{test}: skipped: no `ip` command (iproute2)");
        return false;
    }
    sweep_stale();
    true
}

/// A prefix of namespace names unique to this process and call: `hct<pid>-<n>`.
pub fn unique_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "hct{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes the namespaces of test processes that are gone (killed before they could clean
/// up, by a test timeout say): names `hct<pid>-...` whose process no longer exists.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
    {
        let pid = name
            .strip_prefix("hct")
            .and_then(|rest| rest.split('-').next());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// Reads a counter of interface `dev` in namespace `ns`
/// (`/sys/class/net/DEV/statistics/NAME`); 0 when it cannot be read.
pub fn counter(ns: &str, dev: &str, name: &str) -> u64 {
    let path = format!("/sys/class/net/{dev}/statistics/{name}");
    Command::new("ip")
        .args(["netns", "exec", ns, "cat", &path])
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}
