//! Jobs of real processes for the integration tests: the test binary started again as each
//! rank, running its ignored test `rank_of_a_job`.

// Each test binary uses the part it needs.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A TCP port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// Starts `n` ranks of this binary's `rank_of_a_job` with a fresh rendezvous address, the
/// launcher variables and `env`; returns each rank's exit success and output. A rank still
/// running after a minute is killed.
pub fn ranks(n: usize, secret: &str, env: &[(&str, &str)]) -> Vec<(bool, String)> {
    let root = format!("127.0.0.1:{}", free_port());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args(["--ignored", "--exact", "rank_of_a_job", "--nocapture"])
                .env("HCOMM_RANK", r.to_string())
                .env("HCOMM_SIZE", n.to_string())
                .env("HCOMM_ROOT_ADDR", &root)
                .env("HCOMM_JOB_SECRET", secret)
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        })
        .collect()
}

/// Runs `scenario` (named to the ranks in the variable `var`) on `n` ranks with
/// `HCOMM_TIMEOUT=30` and `env`, and checks that every rank succeeds and prints `OK `.
pub fn job_ok(var: &str, scenario: &str, n: usize, env: &[(&str, &str)]) {
    let env = [&[(var, scenario), ("HCOMM_TIMEOUT", "30")], env].concat();
    let results = ranks(n, &format!("{var}-{scenario}"), &env);
    for (r, (ok, text)) in results.iter().enumerate() {
        assert!(
            *ok && text.contains("OK "),
            "rank {r} of {scenario} on {n} ranks:\n{text}"
        );
    }
}
