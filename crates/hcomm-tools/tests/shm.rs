//! Shared-memory transport tests: protocols by size, the forced paths, and a SIGKILLed rank
//! that leaves nothing in /dev/shm while its peers fail fast naming it.

use std::process::Command;
use std::time::{Duration, Instant};

use hcomm_testkit::{collect_outputs, left_in_dev_shm, local_root, run_bounded, spawn_ranks, text};

const HCOMMRUN: &str = env!("CARGO_BIN_EXE_hcommrun");
const CHECK: &str = env!("CARGO_BIN_EXE_hcomm_check");

/// Runs the `protocols` scenario on 3 ranks with `env`; returns each rank's counts line.
fn protocols(env: &[(&str, &str)]) -> Vec<String> {
    protocols_run(&[], env, &[])
}

/// [`protocols`] with the launcher started by the program and arguments `prefix` (none: as
/// it is) and the scenario given `args`.
fn protocols_run(prefix: &[&str], env: &[(&str, &str)], args: &[&str]) -> Vec<String> {
    protocols_lines(3, prefix, env, args)
        .into_iter()
        .map(|(counts, _)| counts)
        .collect()
}

/// [`protocols_run`] on `n` ranks; returns each rank's counts line and its split line
/// (`shm_split=S written=W`).
fn protocols_lines(
    n: usize,
    prefix: &[&str],
    env: &[(&str, &str)],
    args: &[&str],
) -> Vec<(String, String)> {
    let mut c = match prefix.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(HCOMMRUN);
            c
        }
        None => Command::new(HCOMMRUN),
    };
    c.args([
        "-n",
        &n.to_string(),
        "--timeout",
        "100",
        "--",
        CHECK,
        "protocols",
    ])
    .args(args)
    .env("HCOMM_TIMEOUT", "60");
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "protocols with {env:?} failed:\n{t}");
    let line = |r: usize, what: &str| {
        let prefix = format!("[{r}] {what} ");
        t.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("rank {r} printed no {what} line:\n{t}"))
            .to_owned()
    };
    (0..n)
        .map(|r| (line(r, "protocols"), line(r, "split")))
        .collect()
}

/// The numbers of a split line: (messages split, pieces written as their sender).
fn split_counts(line: &str) -> (u64, u64) {
    let num = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    (num("shm_split="), num("written="))
}

/// Two ranks that may spin (`HCOMM_SPIN_US`; a loaded 2-core host would otherwise count as
/// too small) split every pulled message from 1 MiB: the receiver pulls pieces while the
/// sender writes others into its buffer, and the bytes arrive exact (the scenario checks
/// them). Three of the ring's four pulled sizes are at least 1 MiB and in several pieces.
#[test]
fn large_messages_are_copied_by_both_ranks() {
    let env = [
        ("HCOMM_SPIN_US", "50"),
        ("HCOMM_SHM_SPLIT_THRESHOLD", "1048576"),
    ];
    let lines = protocols_lines(2, &[], &env, &["--rounds", "10"]);
    let mut written = 0;
    for (counts, split) in &lines {
        assert_eq!(
            counts,
            "shm=true shm_eager=30 shm_pull=40 shm_push=0 tcp_eager=0 tcp_rendezvous=0"
        );
        let (split, w) = split_counts(split);
        assert_eq!(split, 30, "{lines:?}");
        written += w;
    }
    // Each rank sends 30 split messages of 4 to 13 pieces while it spins in its own wait:
    // its share of at least some of them is written by it.
    assert!(written > 0, "no sender wrote a piece: {lines:?}");
}

/// More local ranks than cores (three on this host's two, or the spin turned off): no
/// split, since the sender would poll for pieces on a core the receiver needs.
#[test]
fn oversubscribed_ranks_do_not_split() {
    let env = [("HCOMM_SHM_SPLIT_THRESHOLD", "0"), ("HCOMM_SPIN_US", "0")];
    for (_, split) in protocols_lines(2, &[], &env, &[]) {
        assert_eq!(split, "shm_split=0 written=0");
    }
}

#[test]
fn messages_take_the_protocol_of_their_size() {
    // Sizes 0, 1, 4096 | 4097, 1 MiB, 1 MiB + 1, 3 MiB + 5 in a ring of 3: every size above
    // the eager limit is pulled (in pieces of HCOMM_SHM_CHUNK: 1, 4, 5 and 13 of them here).
    for line in protocols(&[]) {
        assert_eq!(
            line,
            "shm=true shm_eager=3 shm_pull=4 shm_push=0 tcp_eager=0 tcp_rendezvous=0"
        );
    }
    // A push threshold: sizes 0, 1, 4096 | 4097, 1 MiB | 1 MiB + 1, 3 MiB + 5.
    for line in protocols(&[("HCOMM_SHM_PUSH_THRESHOLD", "1048576")]) {
        assert_eq!(
            line,
            "shm=true shm_eager=3 shm_pull=2 shm_push=2 tcp_eager=0 tcp_rendezvous=0"
        );
    }
}

#[test]
fn cma_off_moves_everything_through_the_rings() {
    for line in protocols(&[("HCOMM_CMA", "off")]) {
        assert_eq!(
            line,
            "shm=true shm_eager=3 shm_pull=0 shm_push=4 tcp_eager=0 tcp_rendezvous=0"
        );
    }
}

/// World rank 1 makes itself non-dumpable once every link is made (and probed: links are
/// made on first use): rank 2's pulls from it are refused by the kernel (`EPERM`), so its
/// messages fall back to the push through the ring, and the others still pull. Root would
/// read it anyway (`CAP_SYS_PTRACE`): the ranks run without that capability.
#[test]
fn a_pull_the_kernel_refuses_falls_back_to_the_push() {
    let prefix: &[&str] = if rustix::process::geteuid().is_root() {
        &["setpriv", "--bounding-set=-sys_ptrace"]
    } else {
        &[]
    };
    let lines = protocols_run(prefix, &[], &["--nodump", "1"]);
    let want = [
        "shm=true shm_eager=3 shm_pull=4 shm_push=0 tcp_eager=0 tcp_rendezvous=0",
        "shm=true shm_eager=3 shm_pull=4 shm_push=4 tcp_eager=0 tcp_rendezvous=0",
        "shm=true shm_eager=3 shm_pull=0 shm_push=0 tcp_eager=0 tcp_rendezvous=0",
    ];
    assert_eq!(lines, want);
}

/// The same with splits (from 1 MiB in pieces of 32 KiB, the ranks allowed to spin): world
/// rank 0's writes into the non-dumpable rank 1 are refused, so rank 1 copies those messages
/// itself (exact, as the scenario checks), and once rank 0 has shown it cannot write (a piece
/// it claimed was refused: it reports the failure, and fails every later offer at once) rank
/// 1 offers it no more splits: of rank 0's 15 pulled messages, rank 1 splits those up to the
/// first that rank 0 claimed a piece of (on a loaded host it may miss the first few, all 15
/// only if it never got to claim one), where it split all 15 before. Rank 2's pulls from rank
/// 1 are refused too, after rank 2 offered a split that rank 1 may have begun to write: rank 2
/// ends the split (waiting for rank 1's piece in flight) and the message falls back to the
/// push.
#[test]
fn a_split_write_the_kernel_refuses_falls_back_to_the_pull() {
    let prefix: &[&str] = if rustix::process::geteuid().is_root() {
        &["setpriv", "--bounding-set=-sys_ptrace"]
    } else {
        &[]
    };
    let env = [
        ("HCOMM_SPIN_US", "50"),
        ("HCOMM_SHM_SPLIT_THRESHOLD", "1048576"),
        ("HCOMM_SHM_CHUNK", "32768"),
    ];
    let lines = protocols_lines(3, prefix, &env, &["--nodump", "1", "--rounds", "5"]);
    let want = [
        "shm=true shm_eager=15 shm_pull=20 shm_push=0 tcp_eager=0 tcp_rendezvous=0",
        "shm=true shm_eager=15 shm_pull=20 shm_push=20 tcp_eager=0 tcp_rendezvous=0",
        "shm=true shm_eager=15 shm_pull=0 shm_push=0 tcp_eager=0 tcp_rendezvous=0",
    ];
    let counts: Vec<&str> = lines.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(counts, want);
    let split: Vec<(u64, u64)> = lines.iter().map(|(_, s)| split_counts(s)).collect();
    assert_eq!(
        split[0].0, 15,
        "rank 0 splits what it receives from rank 2: {lines:?}"
    );
    assert_eq!(
        split[0].1, 0,
        "rank 0 wrote into the non-dumpable rank: {lines:?}"
    );
    assert!(
        (1..15).contains(&split[1].0),
        "rank 1 went on offering splits to rank 0: {lines:?}"
    );
    assert_eq!(split[2].0, 0, "rank 2 pulls nothing from rank 1: {lines:?}");
}

/// World rank 0 stops itself (`SIGSTOP`) in the middle of a 16 MiB split message to rank 1,
/// holding the piece it claimed. Rank 1 does not hang: its receive fails with an error that
/// names rank 0 and says it may be stopped (its heartbeats stop after half of HCOMM_TIMEOUT,
/// 2 s here), and HCOMM_TIMEOUT after it ran out of pieces of its own it revokes the split
/// before the buffer goes back. It then continues rank 0, whose check before its
/// write finds the split revoked: not one byte reaches the buffer rank 1 gave back, and rank
/// 0 counts no piece written.
#[test]
fn a_sender_stopped_in_the_middle_of_a_split_fails_the_pair_and_writes_nothing_after() {
    let t0 = Instant::now();
    let children = spawn_ranks(2, &local_root(), |_| {
        let mut c = Command::new(CHECK);
        c.arg("split-stop")
            .env("HCOMM_TIMEOUT", "2")
            .env("HCOMM_SPIN_US", "50")
            .env("HCOMM_SHM_SPLIT_THRESHOLD", "1048576");
        c
    });
    let outputs = collect_outputs(children, Duration::from_secs(90));
    let all: String = outputs.iter().map(text).collect();
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}:\n{all}",
        t0.elapsed()
    );
    for (r, o) in outputs.iter().enumerate() {
        assert!(o.status.success(), "rank {r} failed:\n{all}");
    }
    let (t0, t1) = (text(&outputs[0]), text(&outputs[1]));
    let failed = t1
        .lines()
        .find_map(|l| l.strip_prefix("split-stop recv failed after "))
        .unwrap_or_else(|| panic!("rank 1's receive did not fail:\n{all}"));
    let ms: u64 = failed.split(' ').next().unwrap().parse().unwrap();
    assert!(
        (900..30_000).contains(&ms),
        "rank 1 gave up after {ms} ms:\n{all}"
    );
    // Lost for its silence (no heartbeat for half of HCOMM_TIMEOUT) or for the piece it
    // holds, whichever rank 1 sees first: either way a stopped process, named.
    assert!(
        failed.contains("peer lost")
            && failed.contains("world rank 0")
            && failed.contains("stopped"),
        "{all}"
    );
    assert!(t1.contains("split-stop buffer untouched"), "{all}");
    assert!(t0.contains("split-stop written=0"), "{all}");
}

/// Runs the `one-sided` scenario on `n` ranks with the scenario given `args`, as root without
/// `CAP_SYS_PTRACE` (which reads a non-dumpable process anyway); returns each rank's counts:
/// (calls that ran under the one-sided algorithm, calls, messages it moved).
fn one_sided_run(n: usize, args: &[&str]) -> Vec<[u64; 3]> {
    let t = one_sided_text(n, args);
    (0..n)
        .map(|r| {
            let prefix = format!("[{r}] onesided calls ");
            let line = t
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("rank {r} printed no counts:\n{t}"));
            let words: Vec<u64> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            assert_eq!(words.len(), 3, "rank {r}: {line}");
            [words[0], words[1], words[2]]
        })
        .collect()
}

/// The output of the `one-sided` scenario on `n` ranks with `args` (as [`one_sided_run`]),
/// which must succeed.
fn one_sided_text(n: usize, args: &[&str]) -> String {
    let mut c = if rustix::process::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set=-sys_ptrace", HCOMMRUN]);
        c
    } else {
        Command::new(HCOMMRUN)
    };
    c.args([
        "-n",
        &n.to_string(),
        "--timeout",
        "200",
        "--",
        CHECK,
        "one-sided",
    ])
    .args(args)
    .env("HCOMM_TIMEOUT", "60");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(240));
    let t = text(&o);
    assert!(
        o.status.success(),
        "one-sided {args:?} on {n} ranks failed:\n{t}"
    );
    t
}

/// World rank 1 turns non-dumpable inside each call, after its check and with no warning,
/// so that its peers are refused cross-memory attach in the middle of the call: every call
/// out of place, and in place those of the collectives whose one-sided form never writes a
/// contribution (broadcast, all-gather, gather, scatter), is done again by its schedule, with
/// exact results on every rank; all-reduce, reduce, reduce-scatter and all-to-all in place
/// fail on every rank, with the error that says why. Rank 1 moves messages in the all-reduce
/// done again (its schedule).
#[test]
fn a_refusal_in_the_middle_of_a_one_sided_call_is_done_again_by_its_schedule() {
    for n in [2, 3] {
        let t = one_sided_text(n, &["--nodump-mid", "1"]);
        for r in 0..n {
            let lines: Vec<&str> = t
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("[{r}] midcall ")))
                .collect();
            assert_eq!(lines.len(), 15, "{n} ranks, rank {r}:\n{t}");
            for line in lines {
                let w: Vec<&str> = line.split_whitespace().collect();
                let (kind, way, outcome) = (w[0], w[1], w[2]);
                let redone = way == "out-of-place"
                    || ["broadcast", "allgather", "gather", "scatter"].contains(&kind);
                let want = if redone { "ok" } else { "refused" };
                assert_eq!(outcome, want, "{n} ranks, rank {r}: {line}\n{t}");
            }
        }
        let allreduce = t
            .lines()
            .find_map(|l| l.strip_prefix("[1] midcall allreduce out-of-place ok moved "))
            .and_then(|m| m.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no all-reduce on rank 1:\n{t}"));
        assert!(
            allreduce > 0,
            "{n} ranks: the all-reduce moved no message:\n{t}"
        );
    }
}

/// Every collective beyond the shared slots on heap buffers (all-to-all and scatter
/// included) runs one-sided, with cross-memory attach: exact results, and not one message.
#[test]
fn large_heap_collectives_run_one_sided_on_2_3_4_ranks() {
    for n in [2, 3, 4] {
        for (r, [onesided, calls, moved]) in one_sided_run(n, &[]).into_iter().enumerate() {
            assert_eq!(onesided, calls, "{n} ranks, rank {r}: calls not one-sided");
            assert_eq!(
                moved, 0,
                "{n} ranks, rank {r}: one-sided calls moved messages"
            );
        }
    }
}

/// World rank 1 turns non-dumpable once the one-sided state exists: the kernel would refuse
/// its peers' cross-memory attach on its buffers, so the calls that need it run their message
/// schedules instead, with the same (checked) results; the inline ones stay one-sided.
#[test]
fn one_sided_collectives_the_kernel_refuses_fall_back_to_their_schedules() {
    for n in [2, 3] {
        let counts = one_sided_run(n, &["--nodump", "1"]);
        for (r, [onesided, calls, _]) in counts.iter().enumerate() {
            assert_eq!(
                onesided, calls,
                "{n} ranks, rank {r}: not planned one-sided"
            );
        }
        // Rank 1's messages are pushed, and it pulls its peers': it moves them all.
        let moved: Vec<u64> = counts.iter().map(|c| c[2]).collect();
        assert!(
            moved[1] > 0,
            "{n} ranks: no call fell back to messages: {moved:?}"
        );
    }
}

#[test]
fn transport_tcp_forces_tcp_between_local_ranks() {
    for line in protocols(&[("HCOMM_TRANSPORT", "tcp")]) {
        assert_eq!(
            line,
            "shm=false shm_eager=0 shm_pull=0 shm_push=0 tcp_eager=4 tcp_rendezvous=3"
        );
    }
}

#[test]
fn ranks_on_two_hosts_use_shm_inside_and_tcp_between() {
    // Hosts of ranks {0, 2} and {1, 3}: each rank's right neighbour is on the other host.
    let mut c = Command::new(HCOMMRUN);
    let script = format!("HCOMM_HOST_ID=host$((HCOMM_RANK % 2)) exec {CHECK} protocols");
    c.args(["-n", "4", "--timeout", "100", "--", "sh", "-c", &script])
        .env("HCOMM_TIMEOUT", "60");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for r in 0..4 {
        let line = format!(
            "[{r}] protocols shm=false shm_eager=0 shm_pull=0 shm_push=0 tcp_eager=4 tcp_rendezvous=3"
        );
        assert!(t.contains(&line), "rank {r}:\n{t}");
    }
}

#[test]
fn a_sigkilled_rank_leaves_no_segment_and_its_peers_fail_fast() {
    // No launcher: the survivors must notice by themselves, well before HCOMM_TIMEOUT.
    let t0 = Instant::now();
    let children = spawn_ranks(3, &local_root(), |_| {
        let mut c = Command::new(CHECK);
        c.arg("kill")
            .env("HCOMM_TIMEOUT", "100")
            .env("HCOMM_DEBUG", "1");
        c
    });
    let outputs = collect_outputs(children, Duration::from_secs(60));
    let elapsed = t0.elapsed();
    let all: String = outputs.iter().map(text).collect();
    assert!(
        elapsed < Duration::from_secs(30),
        "took {elapsed:?}:\n{all}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(outputs[1].status.signal(), Some(9), "{all}");
    // A survivor learns of the death itself (PeerLost naming rank 1) or from the other
    // survivor's abort, whichever comes first; at least one must name the dead rank.
    let mut named = 0;
    for r in [0, 2] {
        let t = text(&outputs[r]);
        assert!(!outputs[r].status.success(), "rank {r} should fail: {t}");
        if t.contains("peer lost") && t.contains("world rank 1") {
            named += 1;
        } else {
            assert!(t.contains("aborted"), "rank {r}: {t}");
        }
    }
    assert!(named > 0, "no survivor named rank 1:\n{all}");
    let names: Vec<&str> = all
        .split_whitespace()
        .filter(|w| w.starts_with("hcomm-") && w.ends_with("-inbox;"))
        .map(|w| w.trim_end_matches(';'))
        .collect();
    assert_eq!(names.len(), 3, "every rank names its inbox:\n{all}");
    // Shared memory alone links them: the death is noticed without a TCP connection.
    assert_eq!(
        all.matches("a TCP connection beside it with []").count(),
        3,
        "{all}"
    );
    for name in names {
        let path = format!("/dev/shm/{name}");
        assert!(
            !std::path::Path::new(&path).exists(),
            "{path} was left behind"
        );
    }
}

#[test]
fn hcommrun_sweeps_what_a_killed_rank_left_in_dev_shm() {
    // Rank 1 holds a pool block nobody mapped yet when it is killed: its name is still in
    // /dev/shm until hcommrun sweeps the job's names at the end.
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "3", "--timeout", "60", "--", CHECK, "kill", "--pool"])
        .env("HCOMM_TIMEOUT", "30")
        .env("HCOMM_DEBUG", "1");
    let (o, elapsed) = run_bounded(&mut c, Duration::from_secs(90));
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("rank 1 was killed by signal SIGKILL"), "{t}");
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}:\n{t}");
    let left = left_in_dev_shm(&t);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn every_protocol_wakes_a_sleeping_receiver() {
    // No spinning: every wait sleeps on the doorbell, and every frame (data, RTS, CTS) must
    // wake it. A lost wake-up shows as a sleep that ran its whole time (100 ms), for nearly
    // every round trip of the size whose frames do not wake (hcomm_check allows fewer than a
    // fifth per size: the host's load makes a few).
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "2", "--timeout", "100", "--", CHECK, "wakeups"])
        .env("HCOMM_TIMEOUT", "60")
        .env("HCOMM_SPIN_US", "0");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[0] OK wakeups") && t.contains("[1] OK wakeups"),
        "{t}"
    );
}

/// Runs `hcomm_check big-pool ARGS` on 2 ranks with default pool settings and
/// `HCOMM_DEBUG=1`, wrapped in `wrap` (a command that runs hcommrun and its arguments);
/// asserts that both ranks finished and that the job left nothing in /dev/shm.
fn big_pool(wrap: &[&str], args: &[&str], limit: Duration) -> String {
    let mut c = Command::new(wrap.first().copied().unwrap_or(HCOMMRUN));
    c.args(wrap.iter().skip(1))
        .args(if wrap.is_empty() {
            &[][..]
        } else {
            &[HCOMMRUN][..]
        })
        .args(["-n", "2", "--timeout", &limit.as_secs().to_string(), "--"])
        .args([CHECK, "big-pool"])
        .args(args)
        .env("HCOMM_TIMEOUT", "60")
        .env("HCOMM_DEBUG", "1")
        .env_remove("HCOMM_POOL_BLOCK")
        .env_remove("HCOMM_POOL_MAX");
    let (o, _) = run_bounded(&mut c, limit + Duration::from_secs(30));
    let t = text(&o);
    assert!(o.status.success(), "big-pool {args:?} failed:\n{t}");
    assert!(
        t.contains("[0] OK big-pool") && t.contains("[1] OK big-pool"),
        "{t}"
    );
    t
}

#[test]
fn the_pool_serves_256_mib_collectives_with_default_settings() {
    // Four 256 MiB buffers per rank, beyond the 64 MiB ordinary block: each gets a grown
    // block, which the peer maps; all-reduce and broadcast results are checked, the second
    // round reuses the blocks, and nothing is left in /dev/shm.
    let t = big_pool(&[], &[], Duration::from_secs(150));
    let left = left_in_dev_shm(&t);
    assert!(left.is_empty(), "left behind: {left:?}\n{t}");
}

/// 1 GiB buffers: 4 GiB of /dev/shm for the job and about a minute on a loaded 2-core
/// machine, so not run by default (`cargo nextest run --run-ignored all pool_serves_1`).
#[test]
#[ignore]
fn the_pool_serves_1_gib_collectives_with_default_settings() {
    let t = big_pool(&[], &["--bytes", "1073741824"], Duration::from_secs(300));
    let left = left_in_dev_shm(&t);
    assert!(left.is_empty(), "left behind: {left:?}\n{t}");
}

#[test]
fn a_full_dev_shm_sends_large_buffers_to_the_heap() {
    // A private /dev/shm of 160 MiB (a mount namespace of this test's own): the rings and an
    // ordinary block fit, 256 MiB buffers do not, so the pool misses and the collectives run
    // on heap memory, with correct results and no SIGBUS.
    let probe = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs /dev/shm",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "skipped: cannot mount a private /dev/shm here (needs unshare and CAP_SYS_ADMIN)"
        );
        return;
    }
    let script = "mount -t tmpfs -o size=160m tmpfs /dev/shm && exec \"$0\" \"$@\"";
    big_pool(
        &["unshare", "--mount", "sh", "-c", script],
        &["--heap"],
        Duration::from_secs(150),
    );
}

#[test]
fn hcommrun_sweeps_a_grown_pool_block_of_a_killed_rank() {
    // As above, with 256 MiB held: a grown block of its own, nobody mapped it.
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "3", "--timeout", "60", "--", CHECK, "kill", "--pool"])
        .args(["--pool-bytes", "268435456"])
        .env("HCOMM_TIMEOUT", "30")
        .env("HCOMM_DEBUG", "1");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(90));
    let t = text(&o);
    assert!(t.contains("rank 1 was killed by signal SIGKILL"), "{t}");
    let left = left_in_dev_shm(&t);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Runs `hcomm_check all-pairs` on 4 ranks under hcommrun, each rank's host id from
/// `host_of` (a shell expression of `HCOMM_RANK`), with `env`; returns each rank's counts of
/// connected TCP sockets once init is done and once every pair exchanged messages, and what
/// the ranks printed.
fn tcp_after_all_pairs(host_of: &str, env: &[(&str, &str)]) -> (Vec<(usize, usize)>, String) {
    let mut c = Command::new(HCOMMRUN);
    let script = format!("HCOMM_HOST_ID={host_of} exec {CHECK} all-pairs --max-size 65536");
    c.args(["-n", "4", "--timeout", "100", "--", "sh", "-c", &script])
        .env("HCOMM_TIMEOUT", "60")
        .env("HCOMM_TCP_STREAMS", "2");
    for (k, v) in env {
        c.env(k, v);
    }
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{env:?}:\n{t}");
    let count = |r: usize, prefix: &str| -> usize {
        let prefix = format!("[{r}] {prefix}");
        t.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|l| l.split("tcp ").nth(1))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("rank {r} printed no count:\n{t}"))
    };
    let counts = (0..4)
        .map(|r| (count(r, "listening "), count(r, "after all-pairs ")))
        .collect();
    (counts, t)
}

/// Ranks of one host are linked by shared memory alone: besides its connection to the store
/// (hcommrun's), a rank opens TCP connections only to ranks of other hosts (2 streams each),
/// and none at all in a job on one host; `HCOMM_TRANSPORT=tcp` still connects every pair.
/// Init connects no pair at all (links are made on first use): every rank has dialed only the
/// store's connection until the exchange (a faster peer may already have dialed it).
#[test]
fn local_ranks_open_no_tcp_connection_between_them() {
    // Each rank's counts (dialed after init, connected after the exchange) against `want`
    // connected after it; a failure shows what every rank printed (its connections).
    let check = |(counts, t): (Vec<(usize, usize)>, String), want: usize, case: &str| {
        assert!(
            counts.iter().all(|&(init, _)| init == 1),
            "{case}, after init: {counts:?}:\n{t}"
        );
        assert!(
            counts.iter().all(|&(_, all)| all == want),
            "{case}, after all-pairs (want {want}): {counts:?}:\n{t}"
        );
    };
    check(tcp_after_all_pairs("one", &[]), 1, "one host");
    // Hosts {0, 1} and {2, 3}: two remote peers each.
    check(
        tcp_after_all_pairs("host$((HCOMM_RANK / 2))", &[]),
        1 + 2 * 2,
        "two hosts",
    );
    // Every pair connected.
    check(
        tcp_after_all_pairs("one", &[("HCOMM_TRANSPORT", "tcp")]),
        1 + 3 * 2,
        "TCP only",
    );
}

/// A rank with local and remote peers sleeps in `epoll_wait` (not on its doorbell's futex):
/// its local peer, which has no TCP connection to it, wakes it through its wake socket. Ranks
/// 0 and 1 share a host, 2 and 3 another; 0 and 1 ping-pong 150 times with no spinning, each
/// pausing 2 ms before it sends so that the other's wait sleeps. A lost wake-up makes a sleep
/// run its whole time (100 ms): were the wake-ups lost, every wait would end so, a third of
/// the sleeps or more. A few do under load (a peer kept from running for 100 ms after its
/// pause; the futex sleepers of a one-host job show the same), so at most a tenth may.
#[test]
fn a_local_peer_wakes_a_rank_asleep_in_epoll() {
    let mut c = Command::new(HCOMMRUN);
    let script =
        format!("HCOMM_HOST_ID=host$((HCOMM_RANK / 2)) exec {CHECK} wakeups --pause-us 2000");
    c.args(["-n", "4", "--timeout", "100", "--", "sh", "-c", &script])
        .env("HCOMM_TIMEOUT", "60")
        .env("HCOMM_SPIN_US", "0");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for r in 0..2 {
        let naps: u64 = number(said(&t, r, "wakeups naps=").split(' ').next(), &t);
        let full: u64 = number(
            said(&t, r, &format!("wakeups naps={naps} full_naps="))
                .split(' ')
                .next(),
            &t,
        );
        assert!(
            naps >= 150,
            "rank {r} slept {naps} times in epoll_wait:\n{t}"
        );
        assert!(10 * full <= naps, "rank {r}: {full} lost wake-ups:\n{t}");
        assert!(t.contains(&format!("[{r}] OK wakeups")), "{t}");
    }
}

/// Each rank's inbox use (kB) after `traffic` on 8 ranks of one host, and the inbox's size.
fn inbox_use(traffic: &str) -> Vec<(usize, usize)> {
    let ranks = links_after(traffic, &[]);
    ranks
        .into_iter()
        .map(|(used, size, _)| (used, size))
        .collect()
}

/// Each rank's inbox use (kB) after `traffic` on 8 ranks of one host with `env`, the inbox's
/// size, and the rank's connected TCP sockets.
fn links_after(traffic: &str, env: &[(&str, &str)]) -> Vec<(usize, usize, usize)> {
    let mut c = Command::new(HCOMMRUN);
    c.args([
        "-n",
        "8",
        "--timeout",
        "100",
        "--",
        CHECK,
        "inbox-use",
        "--traffic",
        traffic,
    ])
    .env("HCOMM_TIMEOUT", "60")
    // Through the rings: the one-sided all-to-all uses none.
    .env("HCOMM_ALGO", "alltoall:pairwise")
    .envs(env.iter().copied());
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{traffic}:\n{t}");
    (0..8)
        .map(|r| {
            let line = said(&t, r, "inbox ");
            let n: Vec<usize> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            assert_eq!(n.len(), 2, "{line}");
            let tcp = number(said(&t, r, "tcp ").split_whitespace().next(), &t);
            (n[0], n[1], tcp)
        })
        .collect()
}

/// Making communicators links a rank to about 2 log2(n) peers, not to every rank: after ten
/// splits (even and odd ranks, in reverse order) and dups on 8 ranks, a rank's inbox took
/// memory for at most 4 senders (1, 2 and 4 ranks before it, and the rank 2 after it, which
/// comes before it in its half), each ring a little past its first 64 KiB, where the 7 of
/// an all-to-all take at least 7 * 64 KiB; over TCP (one stream per pair) a rank holds at
/// most its 5 peers' connections (1, 2 and 4 ranks away either way; 4 is both) and its store
/// connection, where an all-to-all links it to all 7.
#[test]
fn making_communicators_links_a_rank_to_log2_n_peers_not_to_all() {
    for (r, (used, _, _)) in links_after("split", &[]).into_iter().enumerate() {
        assert!(used <= 16 + 5 * 64, "rank {r}: {used} kB in use");
    }
    let tcp = [("HCOMM_TRANSPORT", "tcp"), ("HCOMM_TCP_STREAMS", "1")];
    for (r, (_, _, connected)) in links_after("split", &tcp).into_iter().enumerate() {
        assert!(connected <= 5 + 1, "rank {r}: {connected} TCP connections");
    }
    for (r, (_, _, connected)) in links_after("alltoall", &tcp).into_iter().enumerate() {
        assert!(connected >= 7, "rank {r}: {connected} TCP connections");
    }
}

/// An inbox takes memory for the peers that send to it, 64 KiB of ring at a time, not for
/// every local rank: after init and a barrier (each rank hears from 3 of its 7 peers) a rank's
/// inbox holds its first page and at most 4 rings' first 64 KiB; after pairwise all-to-alls of
/// 4 KiB per pair (`HCOMM_ALGO=alltoall:pairwise`: through the rings), the first 64 KiB of all
/// 7. The inbox's size (7 rings of 1 MiB) is never reached.
#[test]
fn an_inbox_takes_memory_for_the_peers_that_send_to_it() {
    for (r, (used, size)) in inbox_use("none").into_iter().enumerate() {
        assert!(size >= 7 << 10, "rank {r}: an inbox of {size} kB");
        assert!(used <= 16 + 4 * 64, "rank {r}: {used} kB in use");
    }
    for (r, (used, size)) in inbox_use("alltoall").into_iter().enumerate() {
        assert!(used >= 7 * 64, "rank {r}: {used} kB in use");
        assert!(
            used <= 16 + 8 * 64 && used < size / 8,
            "rank {r}: {used} kB in use"
        );
    }
}

/// Local peers that never sent to a rank finalize without a goodbye through its rings: the
/// upper half of 8 ranks finalizes (having talked only among themselves) and stays alive,
/// not beating; each rank of the lower half, waiting for a message from every one of them,
/// learns that they finalized (not that they were lost, nor a timeout) from the mark of their
/// inboxes, and its own inbox took no memory for goodbyes.
#[test]
fn local_peers_never_sent_to_finalize_by_a_mark_not_a_goodbye() {
    let done = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("quiet-finalize-{}", std::process::id()));
    let _ = std::fs::remove_file(&done);
    let mut c = Command::new(HCOMMRUN);
    c.args(["-n", "8", "--timeout", "100", "--", CHECK, "quiet-finalize"])
        .arg("--done")
        .arg(&done)
        .env("HCOMM_TIMEOUT", "20");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let _ = std::fs::remove_file(&done);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for r in 0..4 {
        for peer in 4..8 {
            let line = format!("[{r}] finalized {peer} ");
            assert!(t.lines().any(|l| l.starts_with(&line)), "{line}:\n{t}");
        }
        let inbox = said(&t, r, "inbox ");
        let kb: Vec<&str> = inbox.split_whitespace().collect();
        assert_eq!(
            kb[0], kb[1],
            "rank {r}: its inbox grew at the others' finalize: {t}"
        );
    }
}

/// A local pair that cannot do without a connection keeps one, beside pairs that do: a
/// stranger holds rank 1's wake-socket name, so rank 1 publishes that its local peers cannot
/// reach it without a connection. Ranks 0 and 2 then keep a TCP connection with rank 1 and
/// none between them (each says so with HCOMM_DEBUG=1), the job runs, and when rank 1 is
/// SIGKILLed the others still fail fast naming it (they learn it from the connection's end).
#[test]
fn a_pair_that_cannot_go_without_a_connection_keeps_one() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let root = local_root();
    let secret = format!("squat-{}", std::process::id());
    let id = hcomm::internal::shm::job_id(secret.as_bytes(), &root, 0);
    let name = SocketAddr::from_abstract_name(format!("hcomm-{id}-1-wake")).unwrap();
    let _squatter = UnixDatagram::bind_addr(&name).unwrap();
    let t0 = Instant::now();
    let children = spawn_ranks(3, &root, |_| {
        let mut c = Command::new(CHECK);
        c.arg("kill")
            .env("HCOMM_JOB_SECRET", &secret)
            .env("HCOMM_TIMEOUT", "100")
            .env("HCOMM_DEBUG", "1");
        c
    });
    let outputs = collect_outputs(children, Duration::from_secs(60));
    let all: String = outputs.iter().map(text).collect();
    assert!(t0.elapsed() < Duration::from_secs(30), "{all}");
    for (r, beside) in [(0, "[1]"), (1, "[0, 2]"), (2, "[1]")] {
        let t = text(&outputs[r]);
        let line = format!("a TCP connection beside it with {beside})");
        assert!(t.contains(&line), "rank {r}: {t}");
    }
    let named = [0, 2]
        .iter()
        .filter(|&&r| text(&outputs[r]).contains("world rank 1"))
        .count();
    assert!(named > 0, "no survivor named rank 1:\n{all}");
}

/// Runs `hcomm_perf ARGS` on `n` ranks under `hcommrun FLAGS` with `HCOMM_DEBUG=1`, confined
/// to the first `cpus` CPUs this test may use; returns the output, asserting success.
fn perf_on_cpus(n: usize, cpus: usize, flags: &[&str], args: &[&str]) -> String {
    let allowed: Vec<usize> = hcomm_tools::bind::allowed_cores()
        .unwrap()
        .into_iter()
        .flatten()
        .collect();
    let mask = hcomm_tools::bind::cpu_list(&allowed[..cpus.min(allowed.len())]);
    let mut c = Command::new("taskset");
    c.args([
        "-c",
        &mask,
        HCOMMRUN,
        "-n",
        &n.to_string(),
        "--timeout",
        "100",
    ])
    .args(flags)
    .args(["--", PERF])
    .args(args)
    .env("HCOMM_TIMEOUT", "60")
    .env("HCOMM_DEBUG", "1")
    .env_remove("HCOMM_SPIN_US");
    let (o, _) = run_bounded(&mut c, Duration::from_secs(120));
    let t = text(&o);
    assert!(o.status.success(), "{n} ranks on CPUs {mask}:\n{t}");
    t
}

const PERF: &str = env!("CARGO_BIN_EXE_hcomm_perf");

#[test]
fn eight_ranks_on_two_cores_sleep_instead_of_spinning_and_reduce_right() {
    // Correctness, not speed: every checked all-reduce from 1 KiB to 1 MiB is right, with
    // every wait asleep on its futex, and the job ends well within its limit (a waiter that
    // spun or yielded here would hold a core that 7 other ranks need).
    let t = perf_on_cpus(
        8,
        2,
        &[],
        &[
            "allreduce",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "32",
            "-n",
            "5",
            "-w",
            "2",
            "-c",
            "2",
        ],
    );
    for r in 0..8 {
        let line = format!("[{r}] hcomm: rank {r}: 8 local ranks on ");
        let said = t.lines().find(|l| l.starts_with(&line));
        assert!(
            said.is_some_and(|l| l.contains("waits sleep at once")),
            "rank {r} did not take the oversubscribed waits:\n{t}"
        );
    }
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("[0]") && l.contains(" float32 "))
        .collect();
    assert_eq!(rows.len(), 3, "sizes 1K, 32K, 1M:\n{t}");
    for row in rows {
        let wrong = row.split_whitespace().nth(9);
        assert_eq!(wrong, Some("0"), "wrong elements: {row}");
    }
}

#[test]
fn ranks_pinned_one_per_core_still_spin() {
    // A rank pinned to one core has a mask of one CPU; the ranks together have a core each,
    // so their waits spin (the fast path of a pinned 2-rank job).
    if hcomm_tools::bind::allowed_cores().unwrap().len() < 2 {
        return;
    }
    let t = perf_on_cpus(
        2,
        usize::MAX,
        &["--bind-to", "core"],
        &["allreduce", "-b", "8", "-e", "8", "-n", "5"],
    );
    for r in 0..2 {
        let line = format!("[{r}] hcomm: rank {r}: 2 local ranks on 2 core(s): waits spin");
        assert!(t.lines().any(|l| l.starts_with(&line)), "rank {r}:\n{t}");
    }
}

/// With many more ranks than cores (9 ranks held to one core), heap all-reduces of 256 KiB
/// and more go through pool memory (their input copied in, the result out): every result
/// equals the reference, and every rank counted such calls.
#[test]
fn heap_allreduces_of_many_ranks_per_core_go_through_pool_memory() {
    let mut c = Command::new("taskset");
    c.args(["-c", "0", HCOMMRUN, "-n", "9", "--timeout", "150"])
        .args(["--", CHECK, "collectives", "--only", "allreduce"])
        .args(["--max-count", "100000"]);
    let (o, _) = run_bounded(&mut c, Duration::from_secs(180));
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for r in 0..9 {
        let staged: u64 = number(Some(said(&out, r, "staged ").trim()), &out);
        assert!(staged > 0, "rank {r} staged no all-reduce:\n{out}");
    }
}

/// The rest of the line of `out` where rank `r` said `what` (hcommrun's `[r] ` prefix).
fn said<'a>(out: &'a str, r: usize, what: &str) -> &'a str {
    let prefix = format!("[{r}] {what}");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("rank {r} printed no {what:?}:\n{out}"))
}

/// `word` as a number, or a panic that shows the job's output `out`.
fn number<T: std::str::FromStr>(word: Option<&str>, out: &str) -> T {
    word.and_then(|w| w.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a number: {word:?} in:\n{out}"))
}
