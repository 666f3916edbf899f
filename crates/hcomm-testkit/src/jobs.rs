//! Ranks started by hand as a launcher would start them, and their outputs collected within a
//! time limit.

use std::ffi::OsStr;
use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::LAUNCHER_VARS;

/// A job secret no other job of this machine uses: this process, a counter and the time.
pub fn fresh_secret() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "test-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A store address for a job on this host: 127.0.0.1 and a free port.
pub fn local_root() -> String {
    format!("127.0.0.1:{}", crate::free_port())
}

/// Removes from `cmd` the launcher variables of an outer job (see [`LAUNCHER_VARS`]) that the
/// test did not set on it, so that a program runs alone or under the launcher the test starts.
pub fn without_launcher_env(cmd: &mut Command) -> &mut Command {
    for v in LAUNCHER_VARS {
        if !cmd.get_envs().any(|(k, _)| k == OsStr::new(v)) {
            cmd.env_remove(v);
        }
    }
    cmd
}

/// Starts `n` ranks by hand: `command(r)` is rank r's command, to which `HCOMM_RANK`,
/// `HCOMM_SIZE`, `HCOMM_ROOT_ADDR` (`root`, where rank 0 serves the store) and a fresh job
/// secret are added, unless `command(r)` sets them; stdout and stderr are piped.
pub fn spawn_ranks(n: usize, root: &str, command: impl Fn(usize) -> Command) -> Vec<Child> {
    let secret = fresh_secret();
    (0..n)
        .map(|r| {
            let mut c = command(r);
            let set = |c: &Command, k: &str| c.get_envs().any(|(name, _)| name == OsStr::new(k));
            let defaults = [
                ("HCOMM_RANK", r.to_string()),
                ("HCOMM_SIZE", n.to_string()),
                ("HCOMM_ROOT_ADDR", root.to_string()),
                ("HCOMM_JOB_SECRET", secret.clone()),
            ];
            for (k, v) in defaults {
                if !set(&c, k) {
                    c.env(k, v);
                }
            }
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap_or_else(|e| panic!("starting {c:?}: {e}"))
        })
        .collect()
}

/// Reads `from` to its end on a thread of its own.
fn drain(from: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut from) = from {
            let _ = from.read_to_end(&mut v);
        }
        v
    })
}

/// Waits up to `limit` for every child to exit and returns their outputs in order; kills them
/// all and panics with what they printed otherwise.
pub fn collect_outputs(mut children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let until = Instant::now() + limit;
    let pipes: Vec<_> = children
        .iter_mut()
        .map(|c| (drain(c.stdout.take()), drain(c.stderr.take())))
        .collect();
    let mut status = vec![None; children.len()];
    let all = loop {
        for (c, s) in children.iter_mut().zip(status.iter_mut()) {
            if s.is_none() {
                *s = c.try_wait().expect("waiting for a rank");
            }
        }
        if status.iter().all(Option::is_some) {
            break true;
        }
        if Instant::now() > until {
            break false;
        }
        thread::sleep(Duration::from_millis(20));
    };
    if !all {
        for (c, s) in children.iter_mut().zip(status.iter_mut()) {
            if s.is_none() {
                let _ = c.kill();
                *s = c.wait().ok();
            }
        }
    }
    let outputs: Vec<Output> = pipes
        .into_iter()
        .zip(status)
        .map(|((out, err), s)| Output {
            status: s.expect("every rank was waited for"),
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        })
        .collect();
    if !all {
        let text: String = outputs
            .iter()
            .enumerate()
            .map(|(r, o)| format!("rank {r}:\n{}\n", crate::text(o)))
            .collect();
        panic!("the ranks did not all finish within {limit:?} (killed):\n{text}");
    }
    outputs
}

/// Starts `n` ranks of the running test binary, each running its ignored test `rank_of_a_job`
/// with `env`, and returns each rank's exit success and output; ranks still running after a
/// minute are killed (and the call panics with their output).
pub fn self_job(n: usize, env: &[(&str, &str)]) -> Vec<(bool, String)> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let children = spawn_ranks(n, &local_root(), |_| {
        let mut c = Command::new(&exe);
        c.args(["--ignored", "--exact", "rank_of_a_job", "--nocapture"])
            .envs(env.iter().copied());
        c
    });
    collect_outputs(children, Duration::from_secs(60))
        .iter()
        .map(|out| (out.status.success(), crate::text(out)))
        .collect()
}

/// Runs `scenario` (named to the ranks in the variable `var`) as a [`self_job`] of `n` ranks
/// with `HCOMM_TIMEOUT=30` and `env`, and checks that every rank succeeds and prints `OK `.
pub fn job_ok(var: &str, scenario: &str, n: usize, env: &[(&str, &str)]) {
    let env = [&[(var, scenario), ("HCOMM_TIMEOUT", "30")], env].concat();
    for (r, (ok, text)) in self_job(n, &env).iter().enumerate() {
        assert!(
            *ok && text.contains("OK "),
            "rank {r} of {scenario} on {n} ranks:\n{text}"
        );
    }
}
