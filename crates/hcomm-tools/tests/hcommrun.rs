//! End-to-end tests of `hcommrun`, with `sh -c` scripts as the rank program.
//!
//! Every run is bounded: a test that would hang kills hcommrun and fails instead.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
/// No test needs longer; past this hcommrun is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(30);

/// hcommrun with a clean launch environment (the test may itself run under a launcher).
fn hcommrun(args: &[&str]) -> Command {
    let mut cmd = Command::new(HCOMMRUN);
    cmd.args(args)
        .env_remove("HCOMM_ROOT_ADDR")
        .env_remove("HCOMM_JOB_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

struct Finished {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
    elapsed: Duration,
}

impl Finished {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn collect<R: Read + Send + 'static>(mut r: R) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// Waits for `child` at most until `LIMIT` after `start`; kills it and panics past that.
fn wait_bounded(child: &mut Child, start: Instant) -> ExitStatus {
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hcommrun did not finish within {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Runs hcommrun to the end, bounded by `LIMIT`.
fn run(mut cmd: Command) -> Finished {
    let start = Instant::now();
    let mut child = cmd.spawn().expect("start hcommrun");
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    let status = wait_bounded(&mut child, start);
    let elapsed = start.elapsed();
    Finished {
        status,
        stdout: out.join().unwrap(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
        elapsed,
    }
}

fn run_sh(n: usize, script: &str) -> Finished {
    run(hcommrun(&["-n", &n.to_string(), "--", "sh", "-c", script]))
}

/// A fresh directory for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hcommrun-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Parses `[R] rest` lines into (R, rest).
fn prefixed_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .map(|l| {
            let (head, rest) = l
                .split_once("] ")
                .unwrap_or_else(|| panic!("line without rank prefix: {l:?}"));
            let rank = head
                .strip_prefix('[')
                .and_then(|r| r.parse().ok())
                .unwrap_or_else(|| panic!("bad rank prefix: {l:?}"));
            (rank, rest.to_string())
        })
        .collect()
}

/// Whether process `pid` is gone. A zombie counts as gone: it runs no code, and orphans are
/// reaped by init, which in a container may never do it.
fn process_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; no signal is sent.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn assert_all_gone(pids: &[i32]) {
    // hcommrun has exited; orphaned grandchildren may take a moment to die of their SIGKILL.
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|&p| !process_gone(p)).collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() > end {
            for &p in &alive {
                // SAFETY: plain kill of a process this test (indirectly) started, to clean up.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            panic!("processes survived hcommrun: {alive:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_rank_gets_its_environment_and_a_live_store() {
    const N: usize = 4;
    let dir = temp_dir("env");
    let go = dir.join("go");
    let script = r#"echo "$HCOMM_RANK $HCOMM_SIZE $HCOMM_LOCAL_RANK $HCOMM_LOCAL_SIZE $HCOMM_ROOT_ADDR $HCOMM_JOB_SECRET"
        i=0; while [ ! -e "$GO" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"#;
    let mut cmd = hcommrun(&["-n", &N.to_string(), "sh", "-c", script]);
    cmd.env("GO", &go);
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();

    // Read the ranks' lines while they wait, so the store can be checked while it runs.
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let err = collect(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    while lines.len() < N {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("only got {lines:?}");
            }
        }
    }
    let parsed = prefixed_lines(&lines.join("\n"));
    let mut ranks = BTreeSet::new();
    let mut addrs = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for (prefix_rank, rest) in &parsed {
        let f: Vec<&str> = rest.split(' ').collect();
        assert_eq!(f.len(), 6, "line {rest:?}");
        let rank: usize = f[0].parse().unwrap();
        assert_eq!(rank, *prefix_rank, "prefix matches HCOMM_RANK");
        assert_eq!(f[1], N.to_string(), "HCOMM_SIZE");
        assert_eq!(f[2], f[0], "HCOMM_LOCAL_RANK");
        assert_eq!(f[3], N.to_string(), "HCOMM_LOCAL_SIZE");
        ranks.insert(rank);
        addrs.insert(f[4].to_string());
        secrets.insert(f[5].to_string());
    }
    assert_eq!(ranks, (0..N).collect::<BTreeSet<_>>());
    assert_eq!(addrs.len(), 1, "one store address: {addrs:?}");
    assert_eq!(secrets.len(), 1, "one secret: {secrets:?}");
    let secret = secrets.into_iter().next().unwrap();
    assert_eq!(secret.len(), 64, "32 random bytes in hex: {secret}");
    assert!(secret.bytes().all(|c| c.is_ascii_hexdigit()));

    let addr: SocketAddr = addrs.into_iter().next().unwrap().parse().unwrap();
    assert!(addr.ip().is_loopback());
    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("store accepts TCP");
    // The store is hcomm's and holds the secret the ranks were given.
    let wait = Duration::from_secs(5);
    let mut client = hcomm::internal::bootstrap::StoreClient::connect(
        &addr.to_string(),
        secret.as_bytes(),
        wait,
    )
    .expect("the ranks' secret opens the store");
    client.set("hcommrun-test", b"v").unwrap();
    assert_eq!(
        client.get("hcommrun-test").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    assert!(
        hcomm::internal::bootstrap::StoreClient::connect(&addr.to_string(), b"wrong secret", wait)
            .is_err(),
        "a wrong secret is refused"
    );

    std::fs::write(&go, b"").unwrap();
    let status = wait_bounded(&mut child, start);
    reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    assert!(status.success(), "status {status:?}, stderr {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_job_gets_a_fresh_secret() {
    let a = run_sh(1, "echo $HCOMM_JOB_SECRET");
    let b = run_sh(1, "echo $HCOMM_JOB_SECRET");
    assert!(a.status.success() && b.status.success());
    assert_ne!(a.stdout, b.stdout);
}

#[test]
fn given_secret_and_root_addr_are_passed_on() {
    let mut cmd = hcommrun(&[
        "-n",
        "2",
        "sh",
        "-c",
        "echo $HCOMM_ROOT_ADDR $HCOMM_JOB_SECRET",
    ]);
    cmd.env("HCOMM_JOB_SECRET", "s3cret-value")
        .env("HCOMM_ROOT_ADDR", "127.0.0.1:1");
    let f = run(cmd);
    assert!(f.status.success(), "{}", f.stderr);
    let mut lines: Vec<String> = f.stdout_text().lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "[0] 127.0.0.1:1 s3cret-value",
            "[1] 127.0.0.1:1 s3cret-value"
        ]
    );
}

#[test]
fn output_lines_carry_the_rank_prefix() {
    let f = run_sh(
        3,
        r#"echo "out $HCOMM_RANK"; echo "err $HCOMM_RANK" >&2; printf "tail $HCOMM_RANK""#,
    );
    assert!(f.status.success(), "{}", f.stderr);
    let out = f.stdout_text();
    let err = f.stderr.clone();
    for r in 0..3 {
        assert!(out.contains(&format!("[{r}] out {r}\n")), "{out}");
        assert!(
            out.contains(&format!("[{r}] tail {r}\n")),
            "last line without newline: {out}"
        );
        assert!(err.contains(&format!("[{r}] err {r}\n")), "{err}");
        assert!(
            !out.contains(&format!("err {r}")),
            "stderr kept apart: {out}"
        );
    }
    assert_eq!(prefixed_lines(&out).len(), 6);
}

#[test]
fn non_utf8_output_passes_through() {
    let f = run_sh(1, r"printf '\377\376 x\n'");
    assert!(f.status.success(), "{}", f.stderr);
    assert_eq!(f.stdout, b"[0] \xff\xfe x\n");
}

#[test]
fn long_lines_from_many_ranks_are_not_interleaved() {
    const N: usize = 4;
    const LINES: usize = 100;
    // 3000-byte lines: more than one pipe write (PIPE_BUF) can carry atomically.
    let script = format!(
        r#"s=$(printf '%03000d' 0); i=0; while [ $i -lt {LINES} ]; do echo "$HCOMM_RANK-$s"; i=$((i+1)); done"#
    );
    let f = run_sh(N, &script);
    assert!(f.status.success(), "{}", f.stderr);
    let zeros = "0".repeat(3000);
    let mut per_rank = [0usize; N];
    for (rank, rest) in prefixed_lines(&f.stdout_text()) {
        assert_eq!(
            rest,
            format!("{rank}-{zeros}"),
            "line of rank {rank} damaged"
        );
        per_rank[rank] += 1;
    }
    assert_eq!(per_rank, [LINES; N]);
}

#[test]
fn failing_rank_stops_the_job_quickly() {
    let dir = temp_dir("fail");
    let pids = dir.join("pids");
    let script = format!(
        r#"echo $$ >> {p}
        if [ "$HCOMM_RANK" = 1 ]; then
            i=0; while [ "$(wc -l < {p})" -lt 4 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
            echo "rank 1 fails" >&2; exit 3
        fi
        sleep 60"#,
        p = pids.display()
    );
    let f = run_sh(4, &script);
    assert_eq!(
        f.status.code(),
        Some(3),
        "exit status of the failed rank; {}",
        f.stderr
    );
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
    assert!(
        f.stderr.contains("hcommrun: rank 1 exited with status 3"),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains("[1] rank 1 fails"), "{}", f.stderr);
    let p = read_pids(&pids);
    assert_eq!(p.len(), 4);
    assert_all_gone(&p);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rank_killed_by_signal_stops_the_job() {
    let f = run_sh(
        3,
        r#"if [ "$HCOMM_RANK" = 2 ]; then sleep 0.3; kill -9 $$; fi; sleep 60"#,
    );
    assert_eq!(f.status.code(), Some(128 + 9), "{}", f.stderr);
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
    assert!(
        f.stderr
            .contains("hcommrun: rank 2 was killed by signal SIGKILL (9)"),
        "{}",
        f.stderr
    );
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_after_the_grace() {
    let f = run_sh(
        2,
        r#"trap '' TERM; if [ "$HCOMM_RANK" = 0 ]; then sleep 0.5; exit 5; fi; sleep 60"#,
    );
    assert_eq!(f.status.code(), Some(5), "{}", f.stderr);
    // SIGTERM was ignored, so the job ended only with the SIGKILL after the grace.
    assert!(
        f.elapsed >= Duration::from_millis(1500),
        "took {:?}",
        f.elapsed
    );
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
}

#[test]
fn sigterm_to_hcommrun_stops_every_rank_and_their_children() {
    const N: usize = 3;
    let dir = temp_dir("sigterm");
    let pids = dir.join("pids");
    // Each rank writes its own pid and that of a child it starts in the background.
    let script = format!(
        "echo $$ >> {p}; sleep 60 & echo $! >> {p}; wait",
        p = pids.display()
    );
    let start = Instant::now();
    let mut child = hcommrun(&["-n", &N.to_string(), "sh", "-c", &script])
        .spawn()
        .unwrap();
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    while read_pids(&pids).len() < 2 * N {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("ranks did not start: {:?}", read_pids(&pids));
        }
        thread::sleep(Duration::from_millis(20));
    }
    let started = read_pids(&pids);
    let signalled = Instant::now();
    // SAFETY: sends SIGTERM to the hcommrun this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_bounded(&mut child, start);
    assert!(signalled.elapsed() < Duration::from_secs(10));
    let _ = out.join();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert_all_gone(&started);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn timeout_kills_the_job_with_status_124() {
    let f = run(hcommrun(&["-n", "2", "--timeout", "1", "sleep", "60"]));
    assert_eq!(f.status.code(), Some(124), "{}", f.stderr);
    assert!(f.elapsed < Duration::from_secs(10), "took {:?}", f.elapsed);
    assert!(f.stderr.contains("timeout"), "{}", f.stderr);
}

#[test]
fn eight_ranks_work() {
    let f = run_sh(8, "echo rank $HCOMM_RANK of $HCOMM_SIZE");
    assert!(f.status.success(), "{}", f.stderr);
    let mut seen = BTreeSet::new();
    for (rank, rest) in prefixed_lines(&f.stdout_text()) {
        assert_eq!(rest, format!("rank {rank} of 8"));
        seen.insert(rank);
    }
    assert_eq!(seen, (0..8).collect::<BTreeSet<_>>());
}

#[test]
fn all_ranks_succeeding_exits_zero() {
    let f = run(hcommrun(&["-n", "2", "true"]));
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(f.stdout.is_empty());
}

#[test]
fn bad_rank_counts_exit_2() {
    for n in ["0", "abc", "-1", "", "1025", "99999999999"] {
        let f = run(hcommrun(&["-n", n, "true"]));
        assert_eq!(f.status.code(), Some(2), "-n {n:?}: {}", f.stderr);
        assert!(!f.stderr.is_empty(), "-n {n:?} explains itself");
    }
    let f = run(hcommrun(&["true"]));
    assert_eq!(f.status.code(), Some(2), "missing -n: {}", f.stderr);
    let f = run(hcommrun(&["-n", "2"]));
    assert_eq!(f.status.code(), Some(2), "missing program: {}", f.stderr);
    let f = run(hcommrun(&["-n", "2", "--timeout", "0", "true"]));
    assert_eq!(f.status.code(), Some(2), "zero timeout: {}", f.stderr);
}

#[test]
fn missing_program_exits_2() {
    let f = run(hcommrun(&["-n", "3", "hcommrun-no-such-program-xyz"]));
    assert_eq!(f.status.code(), Some(2), "{}", f.stderr);
    assert!(
        f.stderr.contains("hcommrun-no-such-program-xyz") && f.stderr.contains("not found"),
        "{}",
        f.stderr
    );
}

#[test]
fn help_documents_the_variables() {
    let f = run(hcommrun(&["--help"]));
    assert!(f.status.success());
    let help = f.stdout_text();
    for var in [
        "HCOMM_RANK",
        "HCOMM_SIZE",
        "HCOMM_LOCAL_RANK",
        "HCOMM_LOCAL_SIZE",
        "HCOMM_ROOT_ADDR",
        "HCOMM_JOB_SECRET",
        "--timeout",
    ] {
        assert!(help.contains(var), "--help lacks {var}");
    }
}

/// The CPUs of a kernel CPU list such as `0-2,5`.
fn parse_cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(lo.parse::<usize>().unwrap()..=hi.parse::<usize>().unwrap());
    }
    cpus
}

/// Runs `n` ranks with `flags`; each reports HCOMM_BIND_TO, HCOMM_BIND_CPUS and the CPUs its
/// shell may run on (from the kernel). Returns them by rank.
fn affinities(n: usize, flags: &[&str]) -> Vec<(String, String, Vec<usize>)> {
    let script = "echo \"$HCOMM_BIND_TO;${HCOMM_BIND_CPUS-unset};\
                  $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$$/status)\"";
    let n_text = n.to_string();
    let mut args = vec!["-n", &n_text];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let f = run(hcommrun(&args));
    assert!(f.status.success(), "{}", f.stderr);
    let mut by_rank = vec![None; n];
    for (rank, rest) in prefixed_lines(&f.stdout_text()) {
        let fields: Vec<&str> = rest.split(';').collect();
        let cpus = parse_cpu_list(fields[2]);
        by_rank[rank] = Some((fields[0].to_owned(), fields[1].to_owned(), cpus));
    }
    by_rank
        .into_iter()
        .map(|r| r.expect("a rank reported nothing"))
        .collect()
}

#[test]
fn ranks_that_fit_are_pinned_to_distinct_cores_within_the_mask() {
    let cores = hcomm_tools::bind::allowed_cores().unwrap();
    let mine: Vec<usize> = cores.iter().flatten().copied().collect();
    if cores.len() < 2 {
        // One allowed core: two ranks do not fit, so they are left alone.
        for (bind, _, cpus) in affinities(2, &[]) {
            assert_eq!((bind.as_str(), cpus), ("none", mine.clone()));
        }
        return;
    }
    for flags in [&[][..], &["--bind-to", "core"][..]] {
        let got = affinities(2, flags);
        for (rank, (bind, listed, cpus)) in got.iter().enumerate() {
            assert_eq!(bind, "core", "{flags:?}");
            assert_eq!(cpus, &cores[rank], "rank {rank} {flags:?}");
            assert_eq!(listed, &hcomm_tools::bind::cpu_list(&cores[rank]));
        }
        assert!(got[0].2.iter().all(|c| !got[1].2.contains(c)), "{got:?}");
    }
}

#[test]
fn bind_to_none_and_oversubscription_leave_the_mask() {
    let cores = hcomm_tools::bind::allowed_cores().unwrap();
    let mine: Vec<usize> = cores.iter().flatten().copied().collect();
    let over = cores.len() + 1;
    for (n, flags) in [(2, &["--bind-to", "none"][..]), (over, &[][..])] {
        for (bind, listed, cpus) in affinities(n, flags) {
            assert_eq!((bind.as_str(), listed.as_str()), ("none", "unset"));
            assert_eq!(cpus, mine, "-n {n} {flags:?}");
        }
    }
    // Asking for a core each when the ranks do not fit is refused, as mpirun does.
    let f = run(hcommrun(&[
        "-n",
        &over.to_string(),
        "--bind-to",
        "core",
        "true",
    ]));
    assert_eq!(f.status.code(), Some(2), "{}", f.stderr);
    assert!(f.stderr.contains("--bind-to none"), "{}", f.stderr);
    let f = run(hcommrun(&["-n", "1", "--bind-to", "socket", "true"]));
    assert_eq!(f.status.code(), Some(2), "{}", f.stderr);
}
